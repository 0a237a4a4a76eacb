package route

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/kvindex"
)

// Router is the kvmesh policy: filters, score, load gate, spreading tie-break, session
// stickiness and reservations. It is safe for concurrent use.
type Router struct {
	liveConfig

	mu     sync.Mutex
	rng    *rand.Rand
	counts FilterCounts
	res    map[string]*peerRes
	refs   map[string]refusal
	nextID uint64
	sess   sessions
	placed map[uint64]placement // new agents this node placed, until their home advertises them
	keys   []sortKey            // scratch for sortLocked
	loads  []int                // scratch for agentLoadsLocked
	order  []ranked             // scratch for homeLocked
	tmp    []Candidate          // scratch for sortLocked
}

var _ Policy = (*Router)(nil)

// New validates cfg (filling zero thresholds with defaults) and returns a Router.
func New(cfg Config) (*Router, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	r := &Router{
		rng:    rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		res:    make(map[string]*peerRes),
		refs:   make(map[string]refusal),
		sess:   sessions{max: cfg.MaxSessions, m: make(map[string]*sessEntry)},
		placed: make(map[uint64]placement),
	}
	r.init(cfg)
	return r, nil
}

// Name returns "kvmesh".
func (r *Router) Name() string { return PolicyKvmesh }

// Predict implements Policy.
func (r *Router) Predict(req Request, p *Peer) Candidate { return predict(r.conf(), req, p) }

// Counts returns how many peers each filter has dropped since New (for
// kvmesh_route_filtered_total{reason}).
func (r *Router) Counts() FilterCounts {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counts
}

// Route filters peers, scores the survivors and returns them in dst (reused, best first).
// When none survives it returns a *NoCandidateError. Route records the first candidate as the
// session's peer. Route does not allocate when dst has room for the peers and the request
// carries no new session (internal sort buffers grow once to the largest mesh seen).
func (r *Router) Route(now time.Time, req Request, peers []Peer, dst []Candidate) ([]Candidate, error) {
	dst = dst[:0]
	bt := req.BlockTokens
	if bt <= 0 {
		bt = kvindex.DefaultBlockTokens
	}
	cfg := r.conf()
	need := cfg.ModelBytes[req.Model]
	vendors := cfg.ModelVendors[req.Model]

	r.mu.Lock()
	defer r.mu.Unlock()

	home := r.homeLocked(now, req, peers)
	local := localityApplies(cfg, req, home)
	var held heldPrefix // the best prefix holder the busy filter drops, for the locality rule
	var counts FilterCounts
	for i := range peers {
		p := &peers[i]
		if why, ok := filter(cfg, partWhole, &req, p, need, vendors); !ok {
			counts[why]++
			continue
		}
		rv := r.reservedLocked(now, p.Name)
		if p.Name != home && !req.KeepBusy {
			if r.refusedLocked(now, p.Name, req.Priority) {
				counts[ReasonBusy]++ // busier than its record says: it predicts nothing
				continue
			}
			if busy(cfg, req, bt, p, rv) {
				counts[ReasonBusy]++
				// A busy home keeps the request if its queue allows (its prediction counts
				// it). One busy by KV too: its wait for room is not predicted, but the
				// request waits in the room, routed again each pass with less of its
				// target left, and leaves once the home misses what is left.
				if local && p.PrefixBlocks > 0 {
					c := evaluate(cfg, req, bt, i, p, rv)
					held.see(&c)
				}
				continue
			}
		}
		c := evaluate(cfg, req, bt, i, p, rv)
		limit(cfg, &c, p)
		dst = append(dst, c)
	}
	dst = dropLimited(dst, &counts)
	gated := false
	if local {
		dst, gated = keepLocal(cfg, req, dst, &held, &counts)
	}
	for i, v := range counts {
		r.counts[i] += v
	}
	if len(dst) == 0 {
		return dst, &NoCandidateError{Model: req.Model, Peers: len(peers), Counts: counts}
	}

	if !gated {
		applyGate(cfg, dst)
	}
	r.sortLocked(dst)
	if i := slices.IndexFunc(dst, func(c Candidate) bool { return c.Name == home }); i >= 0 {
		h := dst[i]
		h.Gated, h.Sticky = false, true
		copy(dst[1:i+1], dst[:i])
		dst[0] = h
	} else {
		r.tieBreakLocked(req, dst)
	}
	if req.Session != "" {
		if home != "" {
			r.sess.put(req.Session, home) // even when the home was filtered out: see homeLocked
		} else {
			r.sess.put(req.Session, dst[0].Name)
		}
	}
	return dst, nil
}

// busy counts this node's reservations on top of the peer's last record. The KV test counts
// the blocks the request itself would add there (its uncached prompt and output), so a peer
// busy with one long prompt still takes a short one, and a prefix holder still takes the
// request that mostly reuses its cache; a peer running nothing is never busy by KV, so a
// request larger than the threshold still has somewhere to go. The prefill test leaves the
// request's own prompt out (see Config.BusyQueuedPrefillTokens).
func busy(cfg *Config, req Request, bt int, p *Peer, rv reserved) bool {
	return busyAt(cfg, req, bt, p, rv, cfg.BusyQueuedPrefillTokens)
}

// busyAt is busy with queued the threshold of queued prefill tokens.
func busyAt(cfg *Config, req Request, bt int, p *Peer, rv reserved, queued int) bool {
	if busyKV(cfg, req, bt, p, rv) {
		return true
	}
	if cfg.BusyWaiting > 0 && p.Waiting >= cfg.BusyWaiting || seatless(cfg, &req, p) {
		return true
	}
	return QueuedAhead(p, req.Priority)+rv.prefill > queued
}

// busyKV is busy's KV test: the blocks the request would add (its uncached prompt and output)
// take p's KV use, with this node's reservations, past BusyKVUse.
func busyKV(cfg *Config, req Request, bt int, p *Peer, rv reserved) bool {
	used := p.KVBlocksUsed + rv.blocks
	if p.KVBlocksTotal <= 0 || used <= 0 {
		return false
	}
	prompt := max(req.PromptTokens, 0)
	cached := min(prefixTokens(p.PrefixBlocks, bt, req.TokenScale), prompt)
	need := (prompt - cached + max(req.MaxTokens, 0) + bt - 1) / bt
	return float64(used+need)/float64(p.KVBlocksTotal) > cfg.BusyKVUse
}

// prefixTokens is what blocks cached blocks of bt kvindex tokens hold in the request's own
// tokens (scale: Request.TokenScale).
func prefixTokens(blocks, bt int, scale float64) int {
	n := max(blocks, 0) * bt
	if scale > 0 && scale != 1 {
		n = int(float64(n) * scale)
	}
	return n
}

// QueuedAhead is the prefill queued on p that runs before a request of priority: all of it,
// unless p's engine schedules by priority; then only the work of the request's class and above
// (high: priority > 0; normal: 0; low: < 0), since lower classes wait behind it.
func QueuedAhead(p *Peer, priority int) int {
	total := max(p.QueuedPrefillTokens, 0)
	if !p.PriorityScheduling {
		return total
	}
	switch {
	case priority > 0:
		return min(max(p.QueuedBeforeHigh, 0), total)
	case priority == 0:
		return max(total-max(p.QueuedLowWaiting, 0), 0)
	}
	return total
}

func clamp01(v float64) float64 {
	if !(v > 0) {
		return 0
	}
	return math.Min(v, 1)
}

// evaluate computes a candidate's terms, score and predicted latencies. It is pure.
func evaluate(cfg *Config, req Request, bt, i int, p *Peer, rv reserved) Candidate {
	c := Candidate{Peer: i, Name: p.Name}
	prompt := max(req.PromptTokens, 0)
	tps := p.PrefillTokensPerSecond
	if !(tps > 0) || math.IsInf(tps, 0) {
		tps = cfg.DefaultPrefillTokensPerSecond
	}
	step := p.DecodeStepSeconds
	if !(step > 0) || math.IsInf(step, 0) {
		step = cfg.DefaultDecodeStepSeconds
	}
	t := &c.Terms
	t.PrefillRate, t.Step = tps, toDuration(step)
	t.PrefixTokens = min(prefixTokens(p.PrefixBlocks, bt, req.TokenScale), prompt)
	t.PrefixSaved = toDuration(float64(t.PrefixTokens) / tps)
	if prompt > 0 {
		t.Prefix = float64(t.PrefixTokens) / float64(prompt)
	}
	queued := QueuedAhead(p, req.Priority) + rv.prefill
	t.ReservedTokens, t.ReservedBlocks = rv.prefill, rv.blocks
	t.LoadTokens = queued + max(p.InFlightTokens, 0)
	if lt := float64(t.LoadTokens); lt > 0 {
		t.Load = lt / (lt + float64(cfg.LoadHalfTokens))
	}
	t.FreeKV = 0.5
	if p.KVBlocksTotal > 0 {
		t.FreeKV = clamp01(1 - float64(p.KVBlocksUsed+rv.blocks)/float64(p.KVBlocksTotal))
	}
	t.Power = 0.5
	if p.PowerCapWatts > 0 {
		t.Power = clamp01(1 - p.PowerWatts/p.PowerCapWatts)
	}
	if p.TempC > cfg.ThermalSoftC {
		t.Thermal = clamp01((p.TempC - cfg.ThermalSoftC) / (cfg.ThermalHardC - cfg.ThermalSoftC))
	}
	t.Residency = residency(&req, p)
	t.Adapter = adapterTerm(t.Residency)
	w := &cfg.Weights
	c.Score = on(w.Prefix)*t.Prefix - on(w.Load)*t.Load + on(w.FreeKV)*t.FreeKV + on(w.Power)*t.Power - on(w.Thermal)*t.Thermal +
		on(w.Adapter)*t.Adapter

	c.PredictedTTFT = toDuration(float64(queued+prompt-t.PrefixTokens)/tps + step + adapterLoad(cfg, p, t.Residency))
	base := max(p.Running, 1)
	batch := max(p.Running, 0) + rv.requests + 1
	if p.MaxRunning > 0 && batch > p.MaxRunning {
		batch = max(p.MaxRunning, base)
	}
	t.Batch = batch
	share := on(cfg.DecodeBatchShare)
	c.PredictedTPOT = toDuration(step * (1 - share + share*float64(batch)/float64(base)))
	c.SharedTPOT = c.PredictedTPOT + sharedStep(cfg, max(p.QueuedPrefillTokens, 0)+rv.prefill+prompt-t.PrefixTokens, tps)
	return c
}

// sharedStep is what a step of a chunked-prefill engine with queued prefill tokens queued adds
// to its decodes' step: the step computes up to Config.StepTokens of them (all of the queue,
// whatever the priorities, since the decodes run in the same step), at prefill rate tps.
func sharedStep(cfg *Config, queued int, tps float64) time.Duration {
	if cfg.StepTokens <= 0 || queued <= 0 {
		return 0
	}
	return toDuration(float64(min(queued, cfg.StepTokens)) / tps)
}

// applyGate marks candidates the load gate moves behind the others: c is gated when
// TTFT(c) > min over d≠c of TTFT(d) + slack(c), slack(c) = min(GateSlackFactor × PrefixSaved(c),
// GateMaxSlack) + GateTolerance. The fastest candidate is never gated.
func applyGate(cfg *Config, dst []Candidate) {
	if len(dst) < 2 {
		return
	}
	min1, min2, at := time.Duration(math.MaxInt64), time.Duration(math.MaxInt64), -1
	for i := range dst {
		t := dst[i].PredictedTTFT
		if t < min1 {
			min1, min2, at = t, min1, i
		} else if t < min2 {
			min2 = t
		}
	}
	for i := range dst {
		c := &dst[i]
		other := min1
		if i == at {
			other = min2
		}
		slack := min(toDuration(cfg.GateSlackFactor*c.Terms.PrefixSaved.Seconds()), cfg.GateMaxSlack) + onDur(cfg.GateTolerance)
		c.Gated = c.PredictedTTFT-other > slack
	}
}

// sortKey orders candidates without copying them in every comparison: ungated by score
// (higher first), then gated by predicted TTFT (lower first: they are fallbacks), ties by peer
// index, so the order is total and deterministic. Gated candidates of equal TTFT go by score.
type sortKey struct {
	gated bool
	v     float64 // −score when ungated, TTFT when gated
	s     float64 // −score
	peer  int
	pos   int // index into the unsorted candidates
}

func compareKeys(a, b sortKey) int {
	switch {
	case a.gated != b.gated:
		if a.gated {
			return 1
		}
		return -1
	case a.v < b.v:
		return -1
	case a.v > b.v:
		return 1
	case a.s < b.s:
		return -1
	case a.s > b.s:
		return 1
	}
	return a.peer - b.peer
}

// sortLocked sorts dst through the Router's scratch buffers (grown once, then reused).
func (r *Router) sortLocked(dst []Candidate) {
	keys := r.keys[:0]
	for i := range dst {
		k := sortKey{gated: dst[i].Gated, v: -dst[i].Score, s: -dst[i].Score, peer: dst[i].Peer, pos: i}
		if k.gated {
			k.v = float64(dst[i].PredictedTTFT)
		}
		keys = append(keys, k)
	}
	slices.SortFunc(keys, compareKeys)
	tmp := append(r.tmp[:0], dst...)
	for i, k := range keys {
		dst[i] = tmp[k.pos]
	}
	r.keys, r.tmp = keys, tmp
}

// tieBreakLocked moves the chosen candidate to the front: the session's last peer if it is
// not gated, else the better of two random picks among the ungated candidates within
// Epsilon of the best score (lower token load, then lower predicted TTFT; on a full tie the
// first pick, so equal peers are chosen uniformly).
func (r *Router) tieBreakLocked(req Request, dst []Candidate) {
	pick := -1
	if req.Session != "" {
		if name, ok := r.sess.get(req.Session); ok {
			for i := range dst {
				if dst[i].Gated {
					break
				}
				if dst[i].Name == name {
					pick = i
					dst[i].Sticky = true
					break
				}
			}
		}
	}
	if pick < 0 {
		k := 1
		for k < len(dst) && !dst[k].Gated && dst[0].Score-dst[k].Score <= on(r.conf().Epsilon) {
			k++
		}
		if k < 2 {
			return
		}
		a := r.rng.IntN(k)
		b := r.rng.IntN(k - 1)
		if b >= a {
			b++
		}
		pick = a
		if lessLoaded(&dst[b], &dst[a]) {
			pick = b
		}
	}
	if pick > 0 {
		c := dst[pick]
		copy(dst[1:pick+1], dst[:pick])
		dst[0] = c
	}
}

func lessLoaded(a, b *Candidate) bool {
	if a.Terms.LoadTokens != b.Terms.LoadTokens {
		return a.Terms.LoadTokens < b.Terms.LoadTokens
	}
	return a.PredictedTTFT < b.PredictedTTFT
}
