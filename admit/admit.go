package admit

import (
	"sync"
	"sync/atomic"
	"time"
)

// HTTP statuses of refusals (net/http is not imported: this package stays free of sockets).
const (
	statusBadRequest         = 400
	statusUnauthorized       = 401
	statusNotFound           = 404
	statusTooManyRequests    = 429
	statusServiceUnavailable = 503
)

// Admitter runs the admission layers. It owns the node's API keys, waiting room and output
// length estimator; it is safe for concurrent use, SetConfig included.
type Admitter struct {
	cfg   atomic.Pointer[Config] // replaced whole by SetConfig, never changed in place
	setMu sync.Mutex             // one SetConfig at a time, so the room's and cfg's settings agree
	keys  *Keys
	room  *WaitingRoom
	est   *estimator
}

// New validates cfg and builds an Admitter with no keys (open access) and an empty room.
func New(cfg Config) (*Admitter, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	room, err := NewWaitingRoom(cfg.Queue)
	if err != nil {
		return nil, err
	}
	keyMax := 0
	if cfg.Keys.MaxPriority != nil {
		keyMax = *cfg.Keys.MaxPriority
	}
	keys, err := NewKeys(nil, cfg.Keys.RateTokens, cfg.Keys.BurstTokens, keyMax)
	if err != nil {
		return nil, err
	}
	a := &Admitter{keys: keys, room: room, est: newEstimator(cfg.Budget)}
	a.cfg.Store(&cfg)
	return a, nil
}

// Validate reports whether c is a valid admission config once its zero fields are filled,
// as New and SetConfig would find it.
func (c Config) Validate() error { return c.validate() }

// conf is the configuration in force. A decision may read it more than once; across a
// SetConfig it may see both, each of which is valid.
func (a *Admitter) conf() *Config { return a.cfg.Load() }

// Config returns the configuration in force, defaults filled.
func (a *Admitter) Config() Config { return *a.conf() }

// SetConfig replaces the admission settings while the admitter runs: validation bounds, budget
// limits, tenants and models, the KV marks, the queue's caps and TTL, and the SLO classes. A
// few settings keep the values New was given, since the state built from them stays: Keys (the
// key set's default buckets), Budget's Estimate* fields (the output-length estimator),
// Queue.DrainWindow (the dispatch-rate meter) and ModelInfo, when cfg has none. An invalid cfg
// is an error and changes nothing. A decision in progress may see the old settings, the new
// ones, or some of each; all are valid.
func (a *Admitter) SetConfig(cfg Config) error {
	a.setMu.Lock()
	defer a.setMu.Unlock()
	old := a.conf()
	if cfg.ModelInfo == nil {
		cfg.ModelInfo = old.ModelInfo
	}
	cfg.Keys = old.Keys
	cfg.Budget.EstimateMinSamples, cfg.Budget.EstimateAlpha = old.Budget.EstimateMinSamples, old.Budget.EstimateAlpha
	cfg.Budget.EstimateSigmas, cfg.Budget.EstimateMaxSeries = old.Budget.EstimateSigmas, old.Budget.EstimateMaxSeries
	cfg.Queue.DrainWindow = old.Queue.DrainWindow
	if err := cfg.validate(); err != nil {
		return err
	}
	if err := a.room.SetConfig(cfg.Queue); err != nil {
		return err
	}
	a.cfg.Store(&cfg)
	return nil
}

// Keys returns the key set; the node calls Keys().Replace when the key file changes.
func (a *Admitter) Keys() *Keys { return a.keys }

// Room returns the waiting room the queue layers consult.
func (a *Admitter) Room() *WaitingRoom { return a.room }

// Observe feeds a finished request's completion length to the output-length estimator.
func (a *Admitter) Observe(model, tenant string, completionTokens int) {
	a.est.observe(model, tenant, completionTokens)
}

// Check runs every layer: Validate, Identify, then Admit with the identified tenant.
func (a *Admitter) Check(now time.Time, req Request, options []Option) Decision {
	if d := a.Validate(req); d.Refused() {
		return d
	}
	tenant, d := a.Identify(now, req)
	if d.Refused() {
		return d
	}
	req.Tenant, req.Priority = tenant, d.Priority
	return a.Admit(now, req, options)
}

// Admit runs layers 3 to 7 for a validated request whose Tenant is trusted (identified here,
// or carried by a forwarding peer), against routing's candidates in preference order. The
// owner re-checks with a single Option built from its exact local state.
//
// Accept names the first candidate that has KV room (at KV.QueueOn) and meets the SLOs, and
// only when nothing of equal or higher rank waits in the room for the same (model, role).
// Queue means wait in the room (the node Pushes Admitter.Item(req, d)). Refusals: 400
// kv_budget (it can never fit on any candidate), 429 queue_full (room at its caps, or a
// sheddable request while the room is busy), 429 slo_unattainable (no candidate can meet the
// TTFT or TPOT target even counting the queue ahead), 503 no_capacity (no candidates).
func (a *Admitter) Admit(now time.Time, req Request, options []Option) Decision {
	return a.admit(now, req, options, true)
}

// Recheck is the owner's check of a forwarded request against its engine's exact state (a
// single Option): Admit without the waiting room. The room holds what this node took in as an
// ingress, waiting for room anywhere in the mesh; the forwarding ingress already ordered the
// request against its own room, so this node's room is not counted: a forwarded request is
// charged only for the queue it is in. Anything but Accept means "not here, now"; the ingress
// tries its next candidate or waits in its own room.
func (a *Admitter) Recheck(now time.Time, req Request, o Option) Decision {
	return a.admit(now, req, []Option{o}, false)
}

// admit runs layers 3 to 7 in order. Each layer either decides (a refusal, or a wait it
// cannot leave to a later layer) or hands what it found on to the next in the pass; the last
// step picks between Accept and Queue. useRoom false leaves the waiting room out (Recheck).
func (a *Admitter) admit(now time.Time, req Request, options []Option, useRoom bool) Decision {
	b := a.budget(req)
	if b.Refused() {
		return b
	}
	if len(options) == 0 {
		return noCapacity(req, b)
	}
	p := pass{a: a, now: now, req: req, options: options, useRoom: useRoom, maxTokens: b.MaxTokens, expected: b.ExpectedTokens}
	p.start()
	if d, done := p.kvLayer(); done {
		return p.finish(d)
	}
	if d, done := p.queueLayer(); done {
		return p.finish(d)
	}
	if d, done := p.sloLayer(); done {
		return p.finish(d)
	}
	return p.finish(p.decide())
}
