package admit

import (
	"container/heap"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"
)

// Item is one queued request. The node builds it with Admitter.Item (or by hand) and keeps its
// own payload in Value.
type Item struct {
	ID       string
	Model    string
	Role     string
	Tenant   string
	Priority int
	Tokens   int // prefill tokens: what the caps and the fairness between tenants count

	Arrived  time.Time
	Deadline time.Time // EDF key within a tenant: arrival + TTFT SLO (zero: Expires)
	Expires  time.Time // arrival + queue TTL (zero: Push fills it from the config)

	Req            Request // the admitted request (tenant and defaults filled)
	MaxTokens      int
	ExpectedTokens int
	Value          any // the node's payload
	// Claim is the room it waits for while it heads its pool and cannot run (ClaimFor; the
	// node's room loop sets it each pass): work behind it runs beside it only on what is left
	// (Claim.Take), and Ready dispatches it there at the admission mark.
	Claim Claim

	seq     uint64
	flow    *flow
	hidx    int // index in flow.items
	eidx    int // index in the expiry heap
	charged int64
}

type poolKey struct{ model, role string }

type pool struct {
	key     poolKey
	bands   []*band // by priority, highest first
	n       int
	tokens  int
	rateTPS float64 // measured prefill rate of the pool (SetPrefillRate)
}

type band struct {
	prio   int
	flows  map[string]*flow
	active []*flow
	vtime  int64 // virtual time: start tag of the last dispatch
	n      int
	tokens int
}

type flow struct {
	tenant string
	band   *band
	items  edfHeap
	finish int64 // virtual finish tag of the flow's last dispatch
	aidx   int   // index in band.active
	tokens int
}

// WaitingRoom holds queued requests at the ingress node: strict priority between bands, fair
// between tenants inside a band (start-time fair queueing in prefill tokens: each dispatch
// charges the tenant its prompt tokens, and the tenant with the smallest virtual start tag
// goes next, so a tenant flooding the room gets its share and no more), earliest deadline
// first inside a tenant, a TTL per item, and caps per (model, role). It is safe for
// concurrent use; it starts no goroutines and reads no clock.
type WaitingRoom struct {
	mu     sync.Mutex
	cfg    QueueConfig
	pools  map[poolKey]*pool
	order  []*pool // round-robin order between pools (independent resources)
	rr     int
	byID   map[string]*Item
	expiry expHeap
	seq    uint64
	drain  drainMeter
}

// NewWaitingRoom builds an empty room from cfg (DefaultConfig().Queue for the defaults).
func NewWaitingRoom(cfg QueueConfig) (*WaitingRoom, error) {
	cfg, err := checkQueue(cfg)
	if err != nil {
		return nil, err
	}
	return &WaitingRoom{cfg: cfg, pools: make(map[poolKey]*pool), byID: make(map[string]*Item),
		drain: drainMeter{window: time.Duration(cfg.DrainWindow)}}, nil
}

// checkQueue fills cfg's zero fields with their defaults and validates it.
func checkQueue(cfg QueueConfig) (QueueConfig, error) {
	c := Config{Models: map[string]ModelConfig{"_": {ContextTokens: 1}}, Validation: DefaultConfig().Validation,
		Budget: DefaultConfig().Budget, KV: DefaultConfig().KV, Queue: cfg}
	if err := c.validate(); err != nil {
		return QueueConfig{}, err
	}
	return c.Queue, nil
}

// SetConfig replaces the room's caps, TTL, fairness and Retry-After settings while it runs;
// the waiters stay, and a lowered cap turns newcomers away until the room is under it again.
// DrainWindow keeps the value the room was built with (it sizes the dispatch-rate meter). An
// invalid cfg is an error and changes nothing.
func (r *WaitingRoom) SetConfig(cfg QueueConfig) error {
	cfg, err := checkQueue(cfg)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	cfg.DrainWindow = r.cfg.DrainWindow
	r.cfg = cfg
	return nil
}

// SetPrefillRate records the measured prefill throughput (tokens/s, summed over the pool's
// nodes) of a (model, role); with QueueConfig.MaxTokens 0 the pool's token cap becomes
// TargetTTFT × rate (PrefillTargetTTFT × rate for the prefill pool of split requests).
func (r *WaitingRoom) SetPrefillRate(model, role string, tokensPerSecond float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.poolLocked(poolKey{model, role}).rateTPS = max(tokensPerSecond, 0)
}

func (r *WaitingRoom) poolLocked(k poolKey) *pool {
	p := r.pools[k]
	if p == nil {
		p = &pool{key: k}
		r.pools[k] = p
		r.order = append(r.order, p)
	}
	return p
}

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

// Push queues it at now, or refuses with ErrQueueFull. When the pool is at a cap, the
// lowest-priority waiters below it.Priority are evicted to make room (returned: the node
// answers them 429 queue_full "evicted by higher priority"); when evicting every lower waiter
// would not make room, nothing is evicted and it is refused. A sheddable item (priority < 0)
// is refused once the pool is past QueueConfig.ShedFraction of a cap. The token cap does not
// apply to an item joining an empty pool, so one long prompt can always wait.
func (r *WaitingRoom) Push(now time.Time, it *Item) ([]*Item, error) {
	if it == nil || it.ID == "" {
		return nil, fmt.Errorf("admit: push: item without id")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.byID[it.ID]; dup {
		return nil, fmt.Errorf("admit: push: duplicate id %q", clip(it.ID))
	}
	if r.cfg.MaxRequests <= 0 {
		return nil, fmt.Errorf("%w: queueing is disabled", ErrQueueFull)
	}
	if len(r.byID) >= r.cfg.MaxTotal {
		return nil, fmt.Errorf("%w: %d requests waiting in all", ErrQueueFull, len(r.byID))
	}
	k := poolKey{it.Model, it.Role}
	p := r.pools[k]
	n, tokens := 0, 0
	if p != nil {
		n, tokens = p.n, p.tokens
	}
	maxReq, maxTok := r.cfg.MaxRequests, r.tokenCapLocked(p)
	cost := max(it.Tokens, 0)
	over := func(n, tokens int) bool {
		return n+1 > maxReq || (n > 0 && tokens+cost > maxTok)
	}
	if it.Priority < 0 {
		f := r.cfg.ShedFraction
		if float64(n+1) > f*float64(maxReq) || (n > 0 && float64(tokens+cost) > f*float64(maxTok)) {
			return nil, fmt.Errorf("%w: %s", ErrQueueFull, shedMessage)
		}
	}
	var evicted []*Item
	if over(n, tokens) {
		// Can evicting every lower-priority waiter, then the latest work of the tenant holding
		// more of the band than this item's tenant, make room? Decide before touching anything.
		ln, lt := lowerLocked(p, it.Priority)
		var fair []*Item
		if over(n-ln, tokens-lt) {
			if fair = r.fairVictimsLocked(p, it.Priority, it.Tenant, cost, n-ln, tokens-lt, over); fair == nil {
				return nil, fmt.Errorf("%w: %d requests and %d prefill tokens waiting for %s (caps %d and %d)",
					ErrQueueFull, n, tokens, clip(it.Model), maxReq, maxTok)
			}
		}
		for over(p.n, p.tokens) && p.bands[len(p.bands)-1].prio < it.Priority {
			v := r.victimLocked(p)
			r.removeLocked(v)
			evicted = append(evicted, v)
		}
		for _, v := range fair {
			if !over(p.n, p.tokens) {
				break
			}
			r.removeLocked(v)
			evicted = append(evicted, v)
		}
	}
	if it.Expires.IsZero() {
		it.Expires = it.Arrived.Add(time.Duration(r.cfg.TTL))
	}
	if it.Deadline.IsZero() {
		it.Deadline = it.Expires
	}
	r.seq++
	it.seq = r.seq
	r.insertLocked(it)
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

// Next removes and returns the next item to dispatch. Pools (model, role) are independent
// resources and are visited round-robin; inside a pool the order is strict priority, then
// fairness between tenants, then EDF. canRun (nil: always) is asked about the pool's head with
// head nil. When it says no, the head waits for room, and up to QueueConfig.Backfill items
// behind it (by priority, then deadline) are offered with head set: canRun must then say yes
// only if the item runs without taking the room the head waits for (Admitter.HoldFor). When
// none may run, that pool is blocked for this call and the next pool is tried. canRun runs
// with the room locked and must not call the room; Admitter.Ready is safe to call from it.
func (r *WaitingRoom) Next(now time.Time, canRun func(it, head *Item) bool) (*Item, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	np := len(r.order)
	for i := range np {
		p := r.order[(r.rr+i)%np]
		it := r.bestLocked(p)
		if it == nil {
			continue
		}
		if canRun != nil && !canRun(it, nil) {
			it = r.backfillLocked(p, it, canRun)
			if it == nil {
				continue
			}
		}
		r.rr = (r.rr + i + 1) % np
		f := it.flow
		start := f.startTag()
		it.charged = int64(max(it.Tokens, r.cfg.MinChargeTokens))
		f.finish = start + it.charged
		f.band.vtime = start
		r.removeLocked(it)
		r.drain.add(now, it.Tokens, 1)
		return it, true
	}
	return nil, false
}

// backfillLocked returns the first of the items behind p's blocked head that canRun lets run
// beside it, or nil. Backfill keeps a pool's engines busy while a large head waits for room
// that small work behind it does not need: strictly head of line, one long prompt waiting for
// three quarters of a node would hold every request of its pool while the other nodes idle.
func (r *WaitingRoom) backfillLocked(p *pool, head *Item, canRun func(it, head *Item) bool) *Item {
	if r.cfg.Backfill <= 0 {
		return nil
	}
	for _, it := range r.behindLocked(p, head, r.cfg.Backfill) {
		if canRun(it, head) {
			return it
		}
	}
	return nil
}

// behindLocked returns up to k items of p other than head: highest band first, earliest
// deadline first inside a band.
func (r *WaitingRoom) behindLocked(p *pool, head *Item, k int) []*Item {
	var out []*Item
	for _, b := range p.bands {
		var band []*Item
		for _, f := range b.active {
			for _, it := range f.items {
				if it != head {
					band = append(band, it)
				}
			}
		}
		slices.SortFunc(band, func(a, b *Item) int {
			if edfLess(a, b) {
				return -1
			}
			return 1
		})
		out = append(out, band[:min(len(band), k-len(out))]...)
		if len(out) == k {
			break
		}
	}
	return out
}

// Requeue puts back an item that Next returned and its owner refused: it keeps its arrival,
// deadline, expiry and place, its tenant's fairness charge is refunded, and the caps are not
// applied (it was already admitted to the room). An id already queued is left alone.
func (r *WaitingRoom) Requeue(it *Item) {
	if it == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.byID[it.ID]; dup || it.flow != nil {
		return
	}
	r.insertLocked(it)
	if it.charged > 0 {
		it.flow.finish = max(it.flow.finish-it.charged, 0)
		it.charged = 0
	}
	r.drain.undo(it.Tokens, 1)
}

// Expire removes and returns the items whose TTL has passed at now (the node answers them
// 429 queue_ttl_expired), earliest first.
func (r *WaitingRoom) Expire(now time.Time) []*Item {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*Item
	for len(r.expiry) > 0 && !r.expiry[0].Expires.After(now) {
		it := r.expiry[0]
		r.removeLocked(it)
		out = append(out, it)
	}
	return out
}

// Remove takes out the item with id (the client went away).
func (r *WaitingRoom) Remove(id string) (*Item, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	it, ok := r.byID[id]
	if ok {
		r.removeLocked(it)
	}
	return it, ok
}

// Len returns the number of queued items.
func (r *WaitingRoom) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.byID)
}

// Waiting returns the items and prefill tokens queued for (model, role).
func (r *WaitingRoom) Waiting(model, role string) (requests, tokens int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.pools[poolKey{model, role}]; p != nil {
		return p.n, p.tokens
	}
	return 0, 0
}

// PoolCap is a pool's token cap (PoolCaps): the prefill tokens its waiters may hold.
type PoolCap struct {
	Model, Pool string // Pool: PoolWhole or PoolPrefill (split requests)
	Tokens      int
}

// PoolCaps returns the token cap of each pool the room knows (one that held a waiter or was
// given a rate), in the order the room met them (the token-cap gauge).
func (r *WaitingRoom) PoolCaps() []PoolCap {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]PoolCap, 0, len(r.order))
	for _, p := range r.order {
		name := PoolWhole
		if p.key.role == RolePrefill {
			name = PoolPrefill
		}
		out = append(out, PoolCap{Model: p.key.model, Pool: name, Tokens: r.tokenCapLocked(p)})
	}
	return out
}

// QueuedTokens returns the prefill tokens queued per priority band, over all pools (the
// queued-tokens gauge).
func (r *WaitingRoom) QueuedTokens() map[int]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[int]int)
	for _, p := range r.order {
		for _, b := range p.bands {
			out[b.prio] += b.tokens
		}
	}
	return out
}

// QueuedRequests returns the items queued per priority band (the queue-depth gauge).
func (r *WaitingRoom) QueuedRequests() map[int]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[int]int)
	for _, p := range r.order {
		for _, b := range p.bands {
			out[b.prio] += b.n
		}
	}
	return out
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

// RetryAfter estimates when a refused client should retry: the queued prefill tokens divided
// by the measured drain rate (tokens dispatched per second over QueueConfig.DrainWindow),
// clamped to [MinRetryAfter, MaxRetryAfter]. With nothing dispatched in the window but work
// queued, the room is not draining and the answer is MaxRetryAfter.
func (r *WaitingRoom) RetryAfter(now time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	lo, hi := time.Duration(r.cfg.MinRetryAfter), time.Duration(r.cfg.MaxRetryAfter)
	queued := 0
	for _, p := range r.order {
		queued += p.tokens
	}
	if len(r.byID) == 0 {
		return lo
	}
	tps, rps := r.drain.rate(now)
	var d time.Duration
	switch {
	case tps > 0 && queued > 0:
		d = time.Duration(float64(queued) / tps * float64(time.Second))
	case rps > 0:
		d = time.Duration(float64(len(r.byID)) / rps * float64(time.Second))
	default:
		return hi
	}
	return min(max(d, lo), hi)
}

// drainMeter counts dispatches in ten buckets spanning the window.
type drainMeter struct {
	window  time.Duration
	buckets [10]struct {
		idx              int64
		tokens, requests int
	}
	first time.Time
	last  int64 // bucket index of the last add, for undo
}

func (m *drainMeter) width() int64 { return max(int64(m.window)/int64(len(m.buckets)), 1) }

func (m *drainMeter) add(now time.Time, tokens, requests int) {
	if m.first.IsZero() || now.Before(m.first) {
		m.first = now
	}
	idx := now.UnixNano() / m.width()
	b := &m.buckets[idx%int64(len(m.buckets))]
	if b.idx != idx {
		b.idx, b.tokens, b.requests = idx, 0, 0
	}
	b.tokens += tokens
	b.requests += requests
	m.last = idx
}

func (m *drainMeter) undo(tokens, requests int) {
	b := &m.buckets[m.last%int64(len(m.buckets))]
	if b.idx == m.last {
		b.tokens = max(b.tokens-tokens, 0)
		b.requests = max(b.requests-requests, 0)
	}
}

// rate returns tokens and requests per second over the window, or over the time since the
// first dispatch when that is shorter (at least one bucket), so a fresh node is not read as
// slow.
func (m *drainMeter) rate(now time.Time) (tps, rps float64) {
	if m.first.IsZero() {
		return 0, 0
	}
	idx := now.UnixNano() / m.width()
	var tok, req int
	for _, b := range m.buckets {
		if b.idx > idx-int64(len(m.buckets)) && b.idx <= idx {
			tok += b.tokens
			req += b.requests
		}
	}
	span := min(m.window, max(now.Sub(m.first), time.Duration(m.width())))
	s := span.Seconds()
	if s <= 0 || math.IsNaN(s) {
		return 0, 0
	}
	return float64(tok) / s, float64(req) / s
}

func edfLess(a, b *Item) bool {
	if !a.Deadline.Equal(b.Deadline) {
		return a.Deadline.Before(b.Deadline)
	}
	return a.seq < b.seq
}

type edfHeap []*Item

func (h edfHeap) Len() int           { return len(h) }
func (h edfHeap) Less(i, j int) bool { return edfLess(h[i], h[j]) }
func (h edfHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i]; h[i].hidx = i; h[j].hidx = j }
func (h *edfHeap) Push(x any)        { it := x.(*Item); it.hidx = len(*h); *h = append(*h, it) }
func (h *edfHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return it
}

type expHeap []*Item

func (h expHeap) Len() int { return len(h) }
func (h expHeap) Less(i, j int) bool {
	if !h[i].Expires.Equal(h[j].Expires) {
		return h[i].Expires.Before(h[j].Expires)
	}
	return h[i].seq < h[j].seq
}
func (h expHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i]; h[i].eidx = i; h[j].eidx = j }
func (h *expHeap) Push(x any)   { it := x.(*Item); it.eidx = len(*h); *h = append(*h, it) }
func (h *expHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return it
}
