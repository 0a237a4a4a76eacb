package admit

import (
	"slices"
	"time"
)

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

// canQueue reports whether Push would accept an item (without eviction races: Push decides).
func (r *WaitingRoom) canQueue(model, role, tenant string, prio, cost int) (ok, shed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cfg.MaxRequests <= 0 || len(r.byID) >= r.cfg.MaxTotal {
		return false, false
	}
	p := r.pools[poolKey{model, role}]
	n, tokens := 0, 0
	if p != nil {
		n, tokens = p.n, p.tokens
	}
	maxReq, maxTok := r.cfg.MaxRequests, r.tokenCapLocked(p)
	if prio < 0 {
		f := r.cfg.ShedFraction
		if float64(n+1) > f*float64(maxReq) || (n > 0 && float64(tokens+cost) > f*float64(maxTok)) {
			return false, true
		}
	}
	over := func(n, tokens int) bool { return n+1 > maxReq || (n > 0 && tokens+cost > maxTok) }
	ln, lt := lowerLocked(p, prio)
	if !over(n-ln, tokens-lt) {
		return true, false
	}
	return r.fairVictimsLocked(p, prio, tenant, cost, n-ln, tokens-lt, over) != nil, false
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

// fairVictimsLocked lists what to evict so that an item of tenant, priority prio and cost
// tokens fits in p (n and tokens: p's load once its lower bands are gone), when its tenant
// holds less of its band than another: the latest deadlines of the tenant with the most queued
// tokens in the band, while that tenant still holds more than tenant will. Fairness decides
// who is refused, not only who goes first: a tenant flooding a full room loses its own latest
// work to a tenant within its share. nil: no such room.
func (r *WaitingRoom) fairVictimsLocked(p *pool, prio int, tenant string, cost, n, tokens int, over func(n, tokens int) bool) []*Item {
	if p == nil {
		return nil
	}
	i := slices.IndexFunc(p.bands, func(b *band) bool { return b.prio == prio })
	if i < 0 {
		return nil
	}
	b := p.bands[i]
	own := cost
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
		if !over(n, tokens) {
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
