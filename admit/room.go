package admit

import (
	"fmt"
	"sync"
	"time"
)

// Item is one queued request. The node builds it with Admitter.Item (or by hand) and keeps its
// own payload in Value.
type Item struct {
	ID       string
	Model    string // the pool's model (Request.PoolModel)
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
	p := r.pools[poolKey{it.Model, it.Role}]
	c := r.spaceLocked(p, max(it.Tokens, 0))
	if it.Priority < 0 && c.shed(r.cfg.ShedFraction) {
		return nil, fmt.Errorf("%w: %s", ErrQueueFull, shedMessage)
	}
	evicted, err := r.makeRoomLocked(p, it, c)
	if err != nil {
		return nil, err
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

// Next removes and returns the next item to dispatch. Pools (model, role) are independent
// resources and are visited round-robin; inside a pool the order is strict priority, then
// fairness between tenants, then EDF. canRun (nil: always) is asked about the pool's head with
// head nil. When it says no, the head waits for room, and up to QueueConfig.Backfill items
// behind it (by priority, then deadline) are offered with head set: canRun must then say yes
// only if the item runs without taking the room the head waits for (Admitter.ClaimFor). When
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
