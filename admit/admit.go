package admit

import (
	"fmt"
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

func refuse(status int, layer, code, param, format string, args ...any) Decision {
	return Decision{Action: Refuse, Status: status, Layer: layer, Code: code, Param: param,
		Message: fmt.Sprintf(format, args...), Option: -1}
}

func (a *Admitter) model(name string) (ModelConfig, bool) {
	if a.conf().ModelInfo != nil {
		ctx, ok := a.conf().ModelInfo(name)
		if !ok {
			return ModelConfig{}, false
		}
		m := a.conf().Models[name]
		m.ContextTokens = ctx
		return m, true
	}
	m, ok := a.conf().Models[name]
	return m, ok
}

// Validate is layer 1: parameter bounds and a model the mesh serves. It is pure and cheap.
func (a *Admitter) Validate(req Request) Decision {
	v := a.conf().Validation
	bad := func(param, format string, args ...any) Decision {
		return refuse(statusBadRequest, LayerValidation, CodeInvalidParameter, param, format, args...)
	}
	switch {
	case req.PromptTokens < 0:
		return bad("prompt", "prompt token count is negative")
	case req.N != nil && (*req.N < 1 || *req.N > v.MaxN):
		if v.MaxN == 1 {
			return bad("n", "n must be 1")
		}
		return bad("n", "n must be between 1 and %d", v.MaxN)
	case req.StopCount < 0 || req.StopCount > v.MaxStop:
		return bad("stop", "at most %d stop sequences are allowed", v.MaxStop)
	case req.MaxTokens != nil && *req.MaxTokens < 1:
		return bad("max_tokens", "max_tokens must be at least 1")
	case req.Temperature != nil && !(*req.Temperature >= 0 && *req.Temperature <= 2):
		return bad("temperature", "temperature must be between 0 and 2")
	case req.TopP != nil && !(*req.TopP >= 0 && *req.TopP <= 1):
		return bad("top_p", "top_p must be between 0 and 1")
	case req.Logprobs != nil && (*req.Logprobs < 0 || *req.Logprobs > v.MaxLogprobs):
		return bad("logprobs", "logprobs must be between 0 and %d", v.MaxLogprobs)
	case req.Priority < -maxPriorityValue || req.Priority > maxPriorityValue:
		return bad("priority", "priority must be between -%d and %d", maxPriorityValue, maxPriorityValue)
	case req.TTFTSLO < 0 || req.TPOTSLO < 0 || req.QueueTTL < 0:
		return bad("slo", "durations must not be negative")
	}
	if _, ok := a.model(req.Model); !ok {
		return refuse(statusNotFound, LayerValidation, CodeModelNotFound, "model",
			"model %q is not served by this mesh", clip(req.Model))
	}
	return Decision{Action: Accept, Layer: LayerValidation, Code: CodeAccepted, Option: -1}
}

// limits returns the default and maximum max_tokens for req: tenant, then model, then Budget.
func (a *Admitter) limits(m ModelConfig, tenant string) (def, maxMT int) {
	def, maxMT = a.conf().Budget.DefaultMaxTokens, a.conf().Budget.MaxMaxTokens
	if m.DefaultMaxTokens > 0 {
		def = m.DefaultMaxTokens
	}
	if m.MaxMaxTokens > 0 {
		maxMT = m.MaxMaxTokens
	}
	if t, ok := a.conf().Tenants[tenant]; ok {
		if t.DefaultMaxTokens > 0 {
			def = t.DefaultMaxTokens
		}
		if t.MaxMaxTokens > 0 {
			maxMT = t.MaxMaxTokens
		}
	}
	if maxMT > 0 {
		def = min(def, maxMT)
	}
	return def, maxMT
}

// Identify is layer 2: the API key names the tenant (headers never do) and pays into its
// token bucket: prompt tokens + max_tokens as layer 3 admits it (the default, a clamp; nothing
// for a request layer 3 refuses), the whole of it even past the key's burst. With no keys
// configured access is open: tenant "default", no limit. It returns the tenant on accept.
func (a *Admitter) Identify(now time.Time, req Request) (string, Decision) {
	if a.keys.Len() == 0 {
		open := maxPriorityValue
		if a.conf().Keys.MaxPriority != nil {
			open = *a.conf().Keys.MaxPriority
		}
		return defaultTenant, granted(Decision{Action: Accept, Layer: LayerIdentity, Code: CodeAccepted, Tenant: defaultTenant, Option: -1}, req.Priority, open)
	}
	st := a.keys.lookup(req.APIKey)
	if st == nil || req.APIKey == "" {
		return "", refuse(statusUnauthorized, LayerIdentity, CodeInvalidAPIKey, "", "invalid or missing API key")
	}
	// What would run, as layer 3 will admit it (the default filled in, a clamp applied): a
	// request it will refuse (a max_tokens past the context or the limit, an unknown model)
	// runs nothing and costs nothing, where charged whole it would lock its key out for hours.
	req.Tenant = st.tenant
	cost := 0
	if bd := a.budget(req); !bd.Refused() {
		cost = max(req.PromptTokens, 0) + bd.MaxTokens
	}
	if cost > 0 {
		if wait, ok := st.take(now, cost); !ok {
			d := refuse(statusTooManyRequests, LayerIdentity, CodeRateLimited, "",
				"rate limit of %.0f tokens/s for this API key exceeded", st.rate)
			d.RetryAfter = wait
			d.Tenant = st.tenant
			return "", d
		}
	}
	return st.tenant, granted(Decision{Action: Accept, Layer: LayerIdentity, Code: CodeAccepted, Tenant: st.tenant, Option: -1}, req.Priority, st.maxPrio)
}

// granted sets the priority d grants a request that asked for asked, under the cap of its key
// (or of an open mesh): asked, or the cap when asked is higher (PriorityClamped).
func granted(d Decision, asked, limit int) Decision {
	d.Priority = min(asked, limit)
	d.PriorityClamped = asked > limit
	return d
}

// budget is layer 3: it fills MaxTokens and ExpectedTokens.
// Budget is layer 3 alone, for a request that is not run through Admit (the Responses API's
// output cap): its max_tokens as admitted (the default, a clamp), or the refusal.
func (a *Admitter) Budget(req Request) Decision { return a.budget(req) }

func (a *Admitter) budget(req Request) Decision {
	m, ok := a.model(req.Model)
	if !ok {
		return refuse(statusNotFound, LayerBudget, CodeModelNotFound, "model",
			"model %q is not served by this mesh", clip(req.Model))
	}
	def, maxMT := a.limits(m, req.Tenant)
	room := m.ContextTokens - req.PromptTokens
	var mt int
	if req.MaxTokens == nil {
		mt = max(min(def, room), 1)
	} else {
		mt = *req.MaxTokens
		if maxMT > 0 && mt > maxMT {
			if !a.conf().Budget.ClampMaxTokens {
				return refuse(statusBadRequest, LayerBudget, CodeInvalidParameter, "max_tokens",
					"max_tokens %d is above this route's limit of %d", mt, maxMT)
			}
			mt = maxMT
		}
	}
	if req.PromptTokens+mt > m.ContextTokens {
		return refuse(statusBadRequest, LayerBudget, CodeContextLengthExceeded, "max_tokens",
			"this model's context is %d tokens; the request has %d prompt tokens and max_tokens %d",
			m.ContextTokens, req.PromptTokens, mt)
	}
	return Decision{Action: Accept, Layer: LayerBudget, Code: CodeAccepted, Tenant: req.Tenant, Option: -1,
		MaxTokens: mt, ExpectedTokens: a.est.expected(req.Model, req.Tenant, mt)}
}

// Class names a priority's class: "high" (> 0), "normal" (0), "low" (< 0, sheddable). The
// three values are the bounded "class" label of goodput metrics.
func Class(priority int) string {
	switch {
	case priority > 0:
		return "high"
	case priority < 0:
		return "low"
	default:
		return "normal"
	}
}

// SLOFor returns the TTFT and TPOT targets of req: its own (the client's hard targets), else
// its class default, the TTFT one plus the request's own prefill time (Request.OwnTTFT).
func (a *Admitter) SLOFor(req Request) (ttft, tpot time.Duration) {
	c := a.conf().SLO.Normal
	switch Class(req.Priority) {
	case "high":
		c = a.conf().SLO.High
	case "low":
		c = a.conf().SLO.Low
	}
	ttft, tpot = req.TTFTSLO, req.TPOTSLO
	if ttft == 0 {
		ttft = time.Duration(c.TTFT) + max(req.OwnTTFT, 0)
	}
	if tpot == 0 {
		tpot = time.Duration(c.TPOT)
	}
	return ttft, tpot
}

// TTL is req's queue TTL: Queue.TTL, which req.QueueTTL (X-Kvmesh-Queue-TTL) may only shorten.
// It bounds the request's wait for its first token, in the waiting room and an engine's queue.
func (a *Admitter) TTL(req Request) time.Duration {
	ttl := time.Duration(a.conf().Queue.TTL)
	if req.QueueTTL > 0 && req.QueueTTL < ttl {
		ttl = req.QueueTTL // the header may only shorten it
	}
	return ttl
}

func (a *Admitter) deadline(req Request) time.Time {
	ttft, _ := a.SLOFor(req)
	if ttft == 0 {
		return req.Arrived.Add(a.TTL(req))
	}
	return req.SLOClock().Add(ttft)
}

// blocks is the KV the request holds on o while it runs: its whole prompt plus expected output,
// in blocks. A cached prefix saves prefill, not room: free KV counts cached blocks no running
// request holds (they are evictable), and running the request takes them out of that pool. Only
// a prefix another running request already holds would be shared, and no state tells which.
// The prefill half, checked by its owner, holds the prompt only: the output is decoded elsewhere.
func (a *Admitter) blocks(req Request, expected int, o Option) int {
	if req.Role == RolePrefill && !o.Split {
		expected = 0
	}
	bt := o.BlockTokens
	if bt <= 0 {
		m, _ := a.model(req.Model)
		bt = m.BlockTokens
	}
	if bt <= 0 {
		bt = 16
	}
	t := max(req.PromptTokens, 0) + expected
	return (t + bt - 1) / bt
}

// fits reports whether need blocks fit on o with KV use after them ≤ thr of its total.
func fits(o Option, need int, thr float64) bool {
	free := o.FreeKVBlocks - need
	if free < 0 {
		return false
	}
	if o.TotalKVBlocks <= 0 {
		return true
	}
	return float64(o.TotalKVBlocks-free) <= thr*float64(o.TotalKVBlocks)
}

// onlyPairs reports whether every option is a pair: no whole candidate is left to fall back on.
func onlyPairs(options []Option) bool {
	for _, o := range options {
		if !o.Split {
			return false
		}
	}
	return len(options) > 0
}

// kvRoom reports whether need blocks fit on o for a request of priority, at the mark of its
// stage (KV.QueueOn to accept, KV.QueueOff to dispatch from the room). Sheddable work stops
// lower, at KV.Sheddable: batch decodes hold their blocks for seconds, and a burst of
// interactive requests must find room. A sheddable request larger than that share on its own
// starts only where under a tenth of the pool is in use, so a long prompt is not held forever.
func (a *Admitter) kvRoom(priority int, o Option, need int, mark float64) bool {
	if o.TotalKVBlocks <= 0 {
		return fits(o, need, mark)
	}
	own := mark
	if priority < 0 {
		own = min(mark, a.conf().KV.Sheddable)
	}
	if fits(o, need, own) {
		return true
	}
	// Larger than its share on its own: it starts where next to nothing else runs, at the
	// stage's mark if it fits under it, else wherever it fits at all. A request is refused or
	// held for contention, never for its size alone.
	total := float64(o.TotalKVBlocks)
	if float64(need) <= own*total || float64(o.TotalKVBlocks-o.FreeKVBlocks) > total/10 {
		return false
	}
	return fits(o, need, mark) || (float64(need) > mark*total && need <= o.FreeKVBlocks)
}

// spare reports whether a request of priority with prompt tokens may start on o now.
// Sheddable work runs only on spare capacity: where a normal request arriving just behind it
// would still meet its TTFT SLO with half of it to spare, i.e. the prefill queued ahead of it
// plus its own within half of slo.normal.ttft. Otherwise its own loose SLO would let it fill
// the engine's first-come-first-served prefill queue up to the point where normal traffic
// misses its SLO (docs/design/admission.md); it waits in the room instead, behind every higher
// band. A prompt whose own prefill alone takes longer than that starts only on
// an engine with next to nothing queued ahead of it (under a tenth of the normal TTFT), so a
// long prompt is not held forever; normal traffic routes around that engine meanwhile.
func (a *Admitter) spare(priority, prompt int, o Option) bool {
	normal := time.Duration(a.conf().SLO.Normal.TTFT)
	if priority >= 0 || normal <= 0 {
		return true
	}
	ahead := o.PredictedTTFT
	if o.PrefillTokensPerSecond > 0 {
		own := float64(max(prompt-o.CachedTokens, 0)) / o.PrefillTokensPerSecond
		ahead -= time.Duration(own * float64(time.Second))
	}
	return o.PredictedTTFT <= normal/2 || ahead <= normal/10
}

// prefillTokens is the prompt less the longest prefix any option holds.
func prefillTokens(prompt int, options []Option) int {
	cached := 0
	for _, o := range options {
		cached = max(cached, o.CachedTokens)
	}
	return max(prompt-cached, 0)
}

// ownTTFT is how long prefill tokens take at the mean prefill rate of the options that report
// one (0 when none does): the part of a request's default TTFT target its own size earns.
func ownTTFT(prefill int, options []Option) time.Duration {
	rate, n := 0.0, 0
	for _, o := range options {
		if o.PrefillTokensPerSecond > 0 {
			rate += o.PrefillTokensPerSecond
			n++
		}
	}
	if prefill <= 0 || n == 0 {
		return 0
	}
	return time.Duration(float64(prefill) / (rate / float64(n)) * float64(time.Second))
}

// aheadWait is how long tokens of prefill queued in the room take at the candidates'
// combined prefill rate (0 when no candidate reports one).
func aheadWait(tokens int, options []Option) time.Duration {
	rate := 0.0
	for _, o := range options {
		rate += max(o.PrefillTokensPerSecond, 0)
	}
	if tokens <= 0 || rate <= 0 {
		return 0
	}
	return time.Duration(float64(tokens) / rate * float64(time.Second))
}

// feasible reports whether o can meet the SLOs given time waited and the wait for the room's
// queue ahead.
func feasible(o Option, ahead, waited, ttftSLO, tpotSLO time.Duration) (time.Duration, bool) {
	ttft := o.PredictedTTFT + max(waited, 0) + ahead

	if ttftSLO > 0 && ttft > ttftSLO {
		return ttft, false
	}
	if tpotSLO > 0 && o.PredictedTPOT > tpotSLO {
		return ttft, false
	}
	return ttft, true
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
// request against its own room. Counting this node's room as well charged the request for a
// queue it was not in, and its refusal sent it back to an ingress whose view still showed room:
// the request bounced between them until its deadline. Anything but Accept means "not here,
// now"; the ingress tries its next candidate or waits in its own room.
func (a *Admitter) Recheck(now time.Time, req Request, o Option) Decision {
	return a.admit(now, req, []Option{o}, false)
}

func (a *Admitter) admit(now time.Time, req Request, options []Option, useRoom bool) Decision {
	d := a.budget(req)
	if d.Refused() {
		return d
	}
	if len(options) == 0 {
		r := refuse(statusServiceUnavailable, LayerRoute, CodeNoCapacity, "", "no node can serve model %q", clip(req.Model))
		r.Tenant, r.MaxTokens, r.ExpectedTokens = req.Tenant, d.MaxTokens, d.ExpectedTokens
		return r
	}
	prefill := prefillTokens(req.PromptTokens, options)
	if req.OwnTTFT == 0 {
		req.OwnTTFT = ownTTFT(prefill, options)
	}
	pool := splitPool(req, options)
	out := func(r Decision) Decision {
		r.Tenant, r.MaxTokens, r.ExpectedTokens, r.PrefillTokens = req.Tenant, d.MaxTokens, d.ExpectedTokens, prefill
		r.OwnTTFT, r.Role = req.OwnTTFT, pool
		if r.Option >= 0 {
			r.Split = options[r.Option].Split
			if !r.Split {
				r.Role = req.Role // accepted whole: a split request's fallback leaves the prefill pool
			}
		}
		if r.Refused() && r.Status == statusTooManyRequests && r.RetryAfter == 0 {
			r.RetryAfter = a.room.RetryAfter(now)
		}
		return r
	}

	// Layer 4: KV. A pair's room is its decode node's forecast for when the handover arrives.
	fit, neverFit := -1, true
	needs := make([]int, len(options))
	views := make([]Option, len(options))
	for i, o := range options {
		views[i] = decodeView(o, d.ExpectedTokens)
		needs[i] = a.blocks(req, d.ExpectedTokens, o)
		if o.TotalKVBlocks <= 0 || needs[i] <= o.TotalKVBlocks {
			neverFit = false
		}
		if fit < 0 && a.kvRoom(req.Priority, views[i], needs[i], a.mark(req, o, false)) {
			fit = i
		}
	}
	if neverFit {
		return out(refuse(statusBadRequest, LayerKV, CodeKVBudget, "max_tokens",
			"the request needs %d KV blocks, more than any candidate holds; lower max_tokens", needs[0]))
	}

	// Layers 5 and 6: queue caps and priority, only for a request that has to wait.
	var aheadN, aheadTokens int
	if useRoom {
		aheadN, aheadTokens = a.room.ahead(req.Model, pool, req.Tenant, req.Priority, a.deadline(req))
	}
	ttftSLO, tpotSLO := a.SLOFor(req)
	waited := now.Sub(req.SLOClock())
	queueCode := ""
	switch {
	case fit < 0 && onlyPairs(options):
		// Refused before any prefill is spent on it when its decode room cannot come in time.
		if r, full := a.decodeFull(options[0], needs[0], d.ExpectedTokens, waited, ttftSLO); full {
			return out(r)
		}
		queueCode = CodeWaitDecode
	case fit < 0:
		queueCode = CodeWaitKV
	case aheadN > 0:
		queueCode = CodeWaitBehind
	}
	if queueCode != "" && useRoom {
		ok, shed := a.room.canQueue(req.Model, pool, req.Tenant, req.Priority, prefill)
		switch {
		case shed:
			return out(refuse(statusTooManyRequests, LayerPriority, CodeQueueFull, "", "%s", shedMessage))
		case !ok:
			n, t := a.room.Waiting(req.Model, pool)
			return out(refuse(statusTooManyRequests, LayerQueue, CodeQueueFull, "",
				"%d requests and %d prefill tokens are already waiting for this model", n, t))
		}
	}

	// Layer 7: SLO feasibility, counting the prefill queued ahead of it in deadline order. The
	// room drains into every candidate at once, so the queue ahead is priced at their combined
	// prefill rate, not one candidate's.
	ahead := aheadWait(aheadTokens, options)
	best, chosen := time.Duration(-1), -1
	anyFeasible := false
	for i, o := range options {
		ttft, ok := feasible(o, ahead, waited, ttftSLO, tpotSLO)
		if best < 0 || ttft < best {
			best = ttft
		}
		if ok {
			anyFeasible = true
			if chosen < 0 && queueCode == "" && a.kvRoom(req.Priority, views[i], needs[i], a.mark(req, o, false)) && a.spare(req.Priority, req.PromptTokens, o) {
				chosen = i
			}
		}
	}
	if !anyFeasible {
		return out(refuse(statusTooManyRequests, LayerSLO, CodeSLOUnattainable, "",
			"no candidate can meet the TTFT target of %v (best predicted %v) or the TPOT target of %v",
			ttftSLO, best.Round(time.Millisecond), tpotSLO))
	}
	if chosen < 0 {
		if queueCode == "" {
			queueCode = CodeWaitKV // the candidates with room miss the SLO; the others may free up
		}
		layer := LayerKV
		if queueCode == CodeWaitBehind {
			layer = LayerPriority
		}
		return out(Decision{Action: Queue, Layer: layer, Code: queueCode, Option: -1})
	}
	return out(Decision{Action: Accept, Layer: LayerSLO, Code: CodeAccepted, Option: chosen, KVBlocks: needs[chosen]})
}

// Item builds the waiting-room item for a request Admit answered Queue.
func (a *Admitter) Item(req Request, d Decision) *Item {
	req.Tenant = d.Tenant
	if req.OwnTTFT == 0 {
		req.OwnTTFT = d.OwnTTFT
	}
	tokens := req.PromptTokens // a decision that does not say (or a prompt wholly cached)
	if d.PrefillTokens > 0 {
		tokens = d.PrefillTokens
	}
	role := req.Role
	if d.Role != "" {
		// A split request waits in the prefill pool. Its Req keeps the ingress's role: a whole
		// candidate that takes it later needs its whole KV, output included (blocks).
		role = d.Role
	}
	return &Item{
		ID: req.ID, Model: req.Model, Role: role, Tenant: d.Tenant, Priority: req.Priority,
		Tokens: tokens, Arrived: req.Arrived, Deadline: a.deadline(req),
		Expires: req.Arrived.Add(a.TTL(req)), Req: req, MaxTokens: d.MaxTokens, ExpectedTokens: d.ExpectedTokens,
	}
}

// Ready re-checks a queued item against fresh candidates (call it from WaitingRoom.Next's
// canRun; it does not touch the room). Accept names the first candidate with KV room at the
// lower KV.QueueOff mark (the hysteresis; KV.Sheddable for sheddable work) that meets the SLOs
// counting the time already waited, with Queue.DispatchSlack of the TTFT target to spare;
// Queue means not yet; Refuse (429 slo_unattainable) means its deadline can no longer be met
// anywhere: the node removes it and answers now rather than serve it late.
func (a *Admitter) Ready(now time.Time, it *Item, options []Option) Decision {
	ttftSLO, tpotSLO := a.SLOFor(it.Req)
	// A queued request is dispatched only with Queue.DispatchSlack of its TTFT target to spare:
	// the room hands out the earliest deadlines first, so under overload every request it
	// dispatches has nearly used its target up waiting, and the estimate's error would make
	// most of them late (docs/design/admission.md).
	dispatchTTFT := ttftSLO - time.Duration(float64(ttftSLO)*max(a.conf().Queue.DispatchSlack, 0))
	waited := now.Sub(it.Req.SLOClock())
	anyFeasible := false
	for i, o := range options {
		if _, ok := feasible(o, 0, waited, dispatchTTFT, tpotSLO); !ok {
			continue
		}
		anyFeasible = true
		need := a.blocks(it.Req, it.ExpectedTokens, o)
		// The hysteresis keeps a drained candidate from flapping between queueing and
		// letting work through; on the room a head claimed, the claim keeps everything else
		// off, so it starts there at the admission mark.
		claimed := it.Claim.Publish && it.Claim.Peer == o.Peer
		if a.kvRoom(it.Priority, decodeView(o, it.ExpectedTokens), need, a.mark(it.Req, o, !claimed)) && a.spare(it.Priority, it.Req.PromptTokens, o) {
			role := it.Role // the pool the accept counts in: a split request run whole counts whole
			if !o.Split && role == RolePrefill {
				role = ""
			}
			return Decision{Action: Accept, Layer: LayerSLO, Code: CodeAccepted, Tenant: it.Tenant, Option: i,
				KVBlocks: need, MaxTokens: it.MaxTokens, ExpectedTokens: it.ExpectedTokens, Role: role, Split: o.Split}
		}
	}
	if !anyFeasible && len(options) > 0 {
		d := refuse(statusTooManyRequests, LayerSLO, CodeSLOUnattainable, "",
			"waited %v; no candidate can still meet the TTFT target of %v", waited.Round(time.Millisecond), ttftSLO)
		d.Tenant, d.MaxTokens, d.ExpectedTokens, d.Role = it.Tenant, it.MaxTokens, it.ExpectedTokens, it.Role
		d.RetryAfter = time.Duration(a.conf().Queue.MinRetryAfter)
		return d
	}
	return Decision{Action: Queue, Layer: LayerKV, Code: CodeWaitKV, Tenant: it.Tenant, Option: -1,
		MaxTokens: it.MaxTokens, ExpectedTokens: it.ExpectedTokens, Role: it.Role}
}

// Claim is the KV room a waiting-room head that cannot run yet waits for: its blocks on the
// candidate where it will fit first. Work queued behind it may run beside it only on what is
// left (WaitingRoom.Next), so backfill never delays the head's start.
type Claim struct {
	Peer   string
	Blocks int
	// Publish: the mesh is to keep off this room too (node/claims.go), and the head starts
	// there at the admission mark (Ready). Only a head on its default TTFT target, not
	// sheddable, waiting on a whole candidate and larger than the hysteresis gap claims so. A
	// request on the default target is promised service whatever its size (it is refused
	// only for the queue ahead of it); one whose client set the target asked to be refused
	// when late, and a room held for it under overload, when it is mostly refused anyway,
	// cost the others 3-5% of goodput. Sheddable work runs on spare capacity only. A pair's
	// room is the decode node's forecast. A head smaller than the gap (KV.QueueOn −
	// KV.QueueOff of the pool) gets room as the engine's running requests end, while a larger
	// one needs the pool to drain below queue_off less its size, which under load the other
	// ingresses' requests never leave time for.
	Publish bool
}

// ClaimFor returns the room the queued head waits for: its KV need on the option with the most
// free blocks among those that can still meet its SLO, or among all when none can (a step of
// an agent is decided again without its SLO). No options: the zero Claim, which claims nothing.
func (a *Admitter) ClaimFor(now time.Time, head *Item, options []Option) Claim {
	ttftSLO, tpotSLO := a.SLOFor(head.Req)
	waited := now.Sub(head.Req.SLOClock())
	best, bestFeasible := -1, false
	for i, o := range options {
		_, feas := feasible(o, 0, waited, ttftSLO, tpotSLO)
		if best < 0 || (feas && !bestFeasible) || (feas == bestFeasible && o.FreeKVBlocks > options[best].FreeKVBlocks) {
			best, bestFeasible = i, feas
		}
	}
	if best < 0 {
		return Claim{}
	}
	o := options[best]
	c := Claim{Peer: o.Peer, Blocks: a.blocks(head.Req, head.ExpectedTokens, o)}
	kv := a.conf().KV
	gap := (kv.QueueOn - kv.QueueOff) * float64(o.TotalKVBlocks)
	c.Publish = c.Peer != "" && head.Req.TTFTSLO == 0 && head.Priority >= 0 && !o.Split && o.TotalKVBlocks > 0 &&
		float64(c.Blocks) > gap
	return c
}

// Take takes h's blocks off the free KV of its peer in options (down to below zero: while the
// head does not fit there, nothing behind it may start there).
func (h Claim) Take(options []Option) {
	for i := range options {
		if options[i].Peer == h.Peer {
			options[i].FreeKVBlocks -= h.Blocks
		}
	}
}

// Evicted is the refusal for a waiter evicted by a higher-priority newcomer, or by one of a
// tenant holding less of its band (WaitingRoom.Push).
func (a *Admitter) Evicted(now time.Time) Decision {
	d := refuse(statusTooManyRequests, LayerPriority, CodeQueueFull, "", "%s", evictedMessage)
	d.RetryAfter = a.room.RetryAfter(now)
	return d
}

// Expired is the refusal for a waiter past its queue TTL.
func (a *Admitter) Expired(now time.Time) Decision {
	d := refuse(statusTooManyRequests, LayerQueue, CodeQueueTTLExpired, "", "the request waited its whole queue TTL")
	d.RetryAfter = a.room.RetryAfter(now)
	return d
}
