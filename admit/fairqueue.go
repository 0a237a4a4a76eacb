package admit

import (
	"container/heap"
	"slices"
	"time"
)

// The room's fair queue: a pool per (model, role), independent of the others; in a pool a
// band per priority; in a band a flow per tenant, ordered between tenants by start-time fair
// queueing in prefill tokens (virtual tags, per band) and inside a tenant by earliest deadline.
// Every count (n, tokens) is kept equal to the sum of what it holds.

type poolKey struct{ model, role string }

// pool is one (model, role)'s waiters. It lives while it has a waiter or a measured rate.
type pool struct {
	key     poolKey
	bands   []*band // by priority, highest first
	n       int
	tokens  int
	rateTPS float64 // measured prefill rate of the pool (SetPrefillRate)
}

// band is one priority's waiters in a pool; it is dropped with its last waiter.
type band struct {
	prio   int
	flows  map[string]*flow
	active []*flow
	vtime  int64 // virtual time: start tag of the last dispatch
	n      int
	tokens int
}

// flow is one tenant's waiters in a band. An idle flow (aidx -1) keeps its finish tag while
// the band's virtual time has not passed it, so a tenant cannot reset its debt by pausing.
type flow struct {
	tenant string
	band   *band
	items  edfHeap
	finish int64 // virtual finish tag of the flow's last dispatch
	aidx   int   // index in band.active
	tokens int
}

// poolLocked returns k's pool, made (and put last in the round-robin order) if new.
func (r *WaitingRoom) poolLocked(k poolKey) *pool {
	p := r.pools[k]
	if p == nil {
		p = &pool{key: k}
		r.pools[k] = p
		r.order = append(r.order, p)
	}
	return p
}

// insertLocked files it in its pool, band and tenant's flow, and in the expiry order.
func (r *WaitingRoom) insertLocked(it *Item) {
	p := r.poolLocked(poolKey{it.Model, it.Role})
	i, found := slices.BinarySearchFunc(p.bands, it.Priority, func(b *band, prio int) int { return prio - b.prio })
	var b *band
	if found {
		b = p.bands[i]
	} else {
		b = &band{prio: it.Priority, flows: make(map[string]*flow)}
		// A new band starts at the virtual time of nothing served: tags are per band.
		p.bands = slices.Insert(p.bands, i, b)
	}
	f := b.flows[it.Tenant]
	if f == nil {
		if len(b.flows) > 2*len(b.active)+64 {
			// Forget idle tenants whose fairness debt virtual time has already passed: they
			// would restart at the band's virtual time anyway. Keeps the map bounded by the
			// tenants that matter, amortised over insertions.
			for name, g := range b.flows {
				if g.aidx < 0 && g.finish <= b.vtime {
					delete(b.flows, name)
				}
			}
		}
		f = &flow{tenant: it.Tenant, band: b, aidx: -1}
		b.flows[it.Tenant] = f
	}
	if f.aidx < 0 {
		f.aidx = len(b.active)
		b.active = append(b.active, f)
	}
	it.flow = f
	heap.Push(&f.items, it)
	heap.Push(&r.expiry, it)
	r.byID[it.ID] = it
	f.tokens += it.Tokens
	b.n++
	b.tokens += it.Tokens
	p.n++
	p.tokens += it.Tokens
}

// removeLocked takes a queued it out of everything insertLocked put it in, dropping an empty
// band, and an empty pool with no measured rate.
func (r *WaitingRoom) removeLocked(it *Item) {
	f := it.flow
	b := f.band
	p := r.pools[poolKey{it.Model, it.Role}]
	heap.Remove(&f.items, it.hidx)
	heap.Remove(&r.expiry, it.eidx)
	delete(r.byID, it.ID)
	it.flow = nil
	f.tokens -= it.Tokens
	b.n--
	b.tokens -= it.Tokens
	p.n--
	p.tokens -= it.Tokens
	if len(f.items) == 0 {
		last := b.active[len(b.active)-1]
		b.active[f.aidx] = last
		last.aidx = f.aidx
		b.active = b.active[:len(b.active)-1]
		f.aidx = -1
	}
	if b.n == 0 {
		// Drop empty bands so the band list stays short; the flows' tags go with them, which
		// is right: fairness debts do not outlive the backlog they came from.
		i := slices.Index(p.bands, b)
		p.bands = slices.Delete(p.bands, i, i+1)
	}
	if p.n == 0 && p.rateTPS == 0 {
		delete(r.pools, p.key)
		i := slices.Index(r.order, p)
		r.order = slices.Delete(r.order, i, i+1)
	}
}

// startTag is the virtual start of f's head in band b.
func (f *flow) startTag() int64 { return max(f.finish, f.band.vtime) }

// bestLocked returns the next item of p: highest band, smallest start tag (ties: earlier
// deadline), EDF within the tenant.
func (r *WaitingRoom) bestLocked(p *pool) *Item {
	if len(p.bands) == 0 {
		return nil
	}
	b := p.bands[0]
	var best *flow
	var bestTag int64
	for _, f := range b.active {
		t := f.startTag()
		if best == nil || t < bestTag || (t == bestTag && edfLess(f.items[0], best.items[0])) {
			best, bestTag = f, t
		}
	}
	return best.items[0]
}

// ahead returns the requests and prefill tokens that would be dispatched before a request of
// tenant, priority and deadline in (model, role), as the room's order would dispatch them:
// every higher band; in its own band, its tenant's items with earlier deadlines (EDF within a
// tenant) and, of every other tenant's backlog, what fair queueing serves before it: the
// tokens whose virtual start comes before the request's own. A tenant flooding the room so
// pushes its own later requests back, not everyone's.
func (r *WaitingRoom) ahead(model, role, tenant string, prio int, deadline time.Time) (n, tokens int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.pools[poolKey{model, role}]
	if p == nil {
		return 0, 0
	}
	for _, b := range p.bands {
		switch {
		case b.prio > prio:
			n += b.n
			tokens += b.tokens
		case b.prio == prio:
			start := b.vtime // the request's virtual start: after its tenant's earlier work
			if f := b.flows[tenant]; f != nil {
				start = f.startTag()
				for _, it := range f.items {
					if !it.Deadline.After(deadline) {
						n++
						tokens += it.Tokens
						start += int64(max(it.Tokens, r.cfg.MinChargeTokens))
					}
				}
			}
			for _, g := range b.active {
				if g.tenant == tenant {
					continue
				}
				// g's items start at its head's tag, one after another in deadline order.
				at := g.startTag()
				for _, it := range g.edfOrder() {
					if at > start || (at == start && it.Deadline.After(deadline)) {
						break // equal tags go earliest deadline first, as Next does
					}
					n++
					tokens += it.Tokens
					at += int64(max(it.Tokens, r.cfg.MinChargeTokens))
				}
			}
		}
	}
	return n, tokens
}

// edfOrder returns f's items earliest deadline first (a copy; the heap is not disturbed).
func (f *flow) edfOrder() []*Item {
	out := slices.Clone([]*Item(f.items))
	slices.SortFunc(out, func(a, b *Item) int {
		if edfLess(a, b) {
			return -1
		}
		if edfLess(b, a) {
			return 1
		}
		return 0
	})
	return out
}
