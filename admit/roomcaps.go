package admit

import (
	"fmt"
	"slices"
	"time"
)

// tokenCapLocked is p's token cap: Queue.MaxTokens when set, else the pool's measured prefill
// rate times its target TTFT (PrefillTargetTTFT for the prefill pool), else FallbackTokens.
func (r *WaitingRoom) tokenCapLocked(p *pool) int {
	if r.cfg.MaxTokens > 0 {
		return r.cfg.MaxTokens
	}
	target := r.cfg.TargetTTFT
	if p != nil && p.key.role == RolePrefill {
		target = r.cfg.PrefillTargetTTFT
	}
	if p != nil && p.rateTPS > 0 && target > 0 {
		return max(int(p.rateTPS*time.Duration(target).Seconds()), 1)
	}
	return r.cfg.FallbackTokens
}

// space is what a pool holds against its caps, for one more item of cost prefill tokens.
type space struct {
	n, tokens      int // the pool's waiters and their prefill tokens
	maxReq, maxTok int // its request and token caps
	cost           int
}

// spaceLocked is p's space (p nil: an empty pool) for an item of cost tokens.
func (r *WaitingRoom) spaceLocked(p *pool, cost int) space {
	c := space{maxReq: r.cfg.MaxRequests, maxTok: r.tokenCapLocked(p), cost: cost}
	if p != nil {
		c.n, c.tokens = p.n, p.tokens
	}
	return c
}

// over reports whether a pool of n waiters holding tokens is past a cap with the item added.
// The token cap does not apply to an item joining an empty pool.
func (c space) over(n, tokens int) bool {
	return n+1 > c.maxReq || (n > 0 && tokens+c.cost > c.maxTok)
}

// shed reports whether the pool with the item added is past fraction f of a cap: a sheddable
// item is refused there.
func (c space) shed(f float64) bool {
	return float64(c.n+1) > f*float64(c.maxReq) || (c.n > 0 && float64(c.tokens+c.cost) > f*float64(c.maxTok))
}

// canQueue reports whether Push would accept an item (without eviction races: Push decides).
func (r *WaitingRoom) canQueue(model, role, tenant string, prio, cost int) (ok, shed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cfg.MaxRequests <= 0 || len(r.byID) >= r.cfg.MaxTotal {
		return false, false
	}
	p := r.pools[poolKey{model, role}]
	c := r.spaceLocked(p, cost)
	if prio < 0 && c.shed(r.cfg.ShedFraction) {
		return false, true
	}
	ln, lt := lowerLocked(p, prio)
	if !c.over(c.n-ln, c.tokens-lt) {
		return true, false
	}
	return r.fairVictimsLocked(p, prio, tenant, c, c.n-ln, c.tokens-lt) != nil, false
}

// makeRoomLocked evicts what an item of it's priority and tenant needs evicted to fit in p
// under c, and returns the evicted: first the lowest-priority waiters below it, then the
// latest work of the tenant holding more of its band than its own tenant (fairVictimsLocked).
// When even that would not make room, it evicts nothing and returns ErrQueueFull.
func (r *WaitingRoom) makeRoomLocked(p *pool, it *Item, c space) ([]*Item, error) {
	if !c.over(c.n, c.tokens) {
		return nil, nil
	}
	// Decide whether eviction can make room before touching anything.
	ln, lt := lowerLocked(p, it.Priority)
	var fair []*Item
	if c.over(c.n-ln, c.tokens-lt) {
		if fair = r.fairVictimsLocked(p, it.Priority, it.Tenant, c, c.n-ln, c.tokens-lt); fair == nil {
			return nil, fmt.Errorf("%w: %d requests and %d prefill tokens waiting for %s (caps %d and %d)",
				ErrQueueFull, c.n, c.tokens, clip(it.Model), c.maxReq, c.maxTok)
		}
	}
	var evicted []*Item
	for c.over(p.n, p.tokens) && p.bands[len(p.bands)-1].prio < it.Priority {
		v := r.victimLocked(p)
		r.removeLocked(v)
		evicted = append(evicted, v)
	}
	for _, v := range fair {
		if !c.over(p.n, p.tokens) {
			break
		}
		r.removeLocked(v)
		evicted = append(evicted, v)
	}
	return evicted, nil
}

// lowerLocked returns the requests and tokens of p's bands below prio.
func lowerLocked(p *pool, prio int) (n, tokens int) {
	if p == nil {
		return 0, 0
	}
	for _, b := range p.bands {
		if b.prio < prio {
			n += b.n
			tokens += b.tokens
		}
	}
	return n, tokens
}

// fairVictimsLocked lists what to evict so that an item of tenant, priority prio and c.cost
// tokens fits in p under c (n and tokens: p's load once its lower bands are gone), when its tenant
// holds less of its band than another: the latest deadlines of the tenant with the most queued
// tokens in the band, while that tenant still holds more than tenant will. Fairness decides
// who is refused, not only who goes first: a tenant flooding a full room loses its own latest
// work to a tenant within its share. nil: no such room.
func (r *WaitingRoom) fairVictimsLocked(p *pool, prio int, tenant string, c space, n, tokens int) []*Item {
	if p == nil {
		return nil
	}
	i := slices.IndexFunc(p.bands, func(b *band) bool { return b.prio == prio })
	if i < 0 {
		return nil
	}
	b := p.bands[i]
	own := c.cost
	if f := b.flows[tenant]; f != nil {
		own += f.tokens
	}
	var h *flow
	for _, g := range b.active {
		if g.tenant != tenant && (h == nil || g.tokens > h.tokens) {
			h = g
		}
	}
	if h == nil {
		return nil
	}
	items := h.edfOrder()
	held := h.tokens
	var out []*Item
	for k := len(items) - 1; k >= 0 && held > own; k-- {
		v := items[k]
		out = append(out, v)
		n, tokens, held = n-1, tokens-v.Tokens, held-v.Tokens
		if !c.over(n, tokens) {
			return out
		}
	}
	return nil
}

// victimLocked picks the eviction victim: in the lowest band, the tenant with the most queued
// tokens (the heaviest user pays), and its item with the latest deadline.
func (r *WaitingRoom) victimLocked(p *pool) *Item {
	b := p.bands[len(p.bands)-1]
	var f *flow
	for _, g := range b.active {
		if f == nil || g.tokens > f.tokens || (g.tokens == f.tokens && g.tenant < f.tenant) {
			f = g
		}
	}
	v := f.items[0]
	for _, it := range f.items {
		if it.Deadline.After(v.Deadline) || (it.Deadline.Equal(v.Deadline) && it.seq > v.seq) {
			v = it
		}
	}
	return v
}
