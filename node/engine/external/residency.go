package external

import (
	"container/list"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/engine/residency"
)

// The residency model: what the server's prefix cache holds, as this Engine knows it from the
// prompts it sent there (package residency), and the queued prefill derived from it. It is
// published through Config.OnPrefix as the embedded engine publishes its exact cache.

// processStart is the Prometheus clients' process start time. vLLM exports it; SGLang, whose
// /metrics is prometheus_client's multiprocess collector, does not.
const processStart = "process_start_time_seconds"

// errorRatioBuckets resolve a model that is right (0), a block or two off, and wrong.
var errorRatioBuckets = []float64{0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1}

// shadow is an Engine's residency model and its queued prefill.
type shadow struct {
	onPrefix func(kvindex.CacheDelta)
	kind     string
	log      *slog.Logger

	mu          sync.Mutex
	model       *residency.Model
	d           residency.Delta // scratch
	engineBlock int             // the server's KV block size in its tokens; 0: unknown
	queued      int             // uncached prompt tokens dispatched and not yet prefilled
	queuedHigh  int             // of queued, those of requests of priority > 0
	queuedLow   int             // and of priority < 0
	order       list.List       // the queued tickets with uncached tokens, in dispatch order
	start       float64         // processStart at the last scrape that had it
	haveStart   bool
	prompts     float64 // the kind's prompt counter at the last scrape that had it
	havePrompts bool
	healthy     bool // at the last scrape
	everHealthy bool // the server has been healthy since the last reset (or since the start)
	// The prompt tokens the server reported and kvmesh counted, over the same requests.
	enginePrompt, kvmeshPrompt float64
	kv                         *kvState // the server's KV events (kvevents.go); nil without

	errRatio  prometheus.Histogram
	predicted prometheus.Counter
	reported  prometheus.Counter
	resets    prometheus.Counter
	blocks    prometheus.GaugeFunc
}

func newShadow(cfg Config, log *slog.Logger) (*shadow, error) {
	m, err := residency.New(cfg.NominalKVBlocks, cfg.BlockTokens)
	if err != nil {
		return nil, fmt.Errorf("external: %w", err)
	}
	r := &shadow{onPrefix: cfg.OnPrefix, kind: cfg.Kind, log: log, model: m}
	if cfg.KVEvents != "" {
		r.kv = &kvState{held: map[uint64]struct{}{}}
	}
	r.errRatio = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "kvmesh_residency_error_ratio",
		Help:    "Per request on the external engine: |predicted - reported cached prompt tokens| / prompt tokens, the residency model's error.",
		Buckets: errorRatioBuckets,
	})
	r.predicted = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_residency_predicted_cached_tokens_total",
		Help: "Prompt tokens the residency model predicted the external engine had cached, in the engine's tokens, over requests it reported cached tokens for.",
	})
	r.reported = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_residency_reported_cached_tokens_total",
		Help: "Prompt tokens the external engine reported cached (usage cached_tokens) for the same requests.",
	})
	r.resets = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_residency_resets_total",
		Help: "External engine restarts detected (process start time changed, counters went back, health returned); each cleared the residency model.",
	})
	r.blocks = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvmesh_residency_blocks",
		Help: "Prompt blocks the residency model holds: what this node advertises its external engine caches.",
	}, func() float64 {
		r.mu.Lock()
		defer r.mu.Unlock()
		return float64(r.model.Len())
	})
	if reg := cfg.Registerer; reg != nil {
		for _, c := range []prometheus.Collector{r.errRatio, r.predicted, r.reported, r.resets, r.blocks} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("external: registering metrics: %w", err)
			}
		}
	}
	return r, nil
}

// publishLocked hands the model's pending changes to OnPrefix, in order (hence under the lock).
func (r *shadow) publishLocked() {
	if !r.d.Empty() && r.onPrefix != nil {
		r.onPrefix(r.d)
	}
	r.d.Reset()
}

// ticket is one request's way through the model, from dispatch to its end. Its fields are
// guarded by shadow.mu.
type ticket struct {
	blocks       []uint64
	promptTokens int
	pred         residency.Prediction
	uncached     int
	priority     int
	queued       bool
	elem         *list.Element // in shadow.order while queued, when uncached > 0
	hold         *residency.Hold
	done         bool
}

// dispatch predicts req's cached prefix and counts its uncached prompt tokens as queued.
func (r *shadow) dispatch(req *engine.Request) *ticket {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := &ticket{blocks: req.Blocks, promptTokens: req.PromptTokens, priority: req.Priority}
	t.pred = r.model.Predict(req.Blocks, req.PromptTokens)
	t.uncached = max(0, req.PromptTokens-t.pred.Tokens)
	t.queued = true
	r.countLocked(t, t.uncached)
	if t.uncached > 0 {
		t.elem = r.order.PushBack(t)
	}
	return t
}

// countLocked adds n tokens of t's to the queued prefill and to its class's.
func (r *shadow) countLocked(t *ticket, n int) {
	r.queued += n
	switch {
	case t.priority > 0:
		r.queuedHigh += n
	case t.priority < 0:
		r.queuedLow += n
	}
}

func (r *shadow) unqueueLocked(t *ticket) {
	if t.queued {
		t.queued = false
		r.countLocked(t, -t.uncached)
		if t.elem != nil {
			r.order.Remove(t.elem)
			t.elem = nil
		}
	}
}

// prefilled: the first token came, so the server computed and cached the prompt.
func (r *shadow) prefilled(t *ticket) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unqueueLocked(t)
	if t.hold == nil && !t.done {
		t.hold = r.model.Acquire(t.blocks, t.promptTokens, &r.d)
		r.creditLocked(len(r.d.Evicted))
	}
	r.publishLocked()
}

// finished: the last chunk came with the server's usage. cachedReported says whether the
// usage had cached_tokens at all (vLLM sends them only with --enable-prompt-tokens-details).
func (r *shadow) finished(t *ticket, u *engine.Usage, cachedReported bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t.done {
		return
	}
	t.done = true
	r.unqueueLocked(t)
	// Output in kvmesh tokens: the server counts its own.
	output := u.CompletionTokens
	if u.PromptTokens > 0 && t.promptTokens > 0 {
		output = u.CompletionTokens * t.promptTokens / u.PromptTokens
		r.enginePrompt += float64(u.PromptTokens)
		r.kvmeshPrompt += float64(t.promptTokens)
	}
	r.model.Release(t.hold, t.promptTokens+output, &r.d)
	r.creditLocked(len(r.d.Evicted))
	if cachedReported && t.promptTokens > 0 {
		o := r.model.Correct(t.pred, t.blocks, t.promptTokens,
			residency.Report{PromptTokens: u.PromptTokens, CachedTokens: u.CachedTokens, EngineBlockTokens: r.engineBlock}, &r.d)
		r.errRatio.Observe(o.ErrorRatio())
		r.predicted.Add(float64(o.PredictedTokens))
		r.reported.Add(float64(o.ReportedTokens))
		if o.Dropped > 0 || o.Added > 0 {
			r.log.Debug("residency corrected", "predicted", o.PredictedTokens, "reported", o.ReportedTokens,
				"dropped", o.Dropped, "added", o.Added)
		}
	}
	r.publishLocked()
}

// ended: the stream closed or failed without a usage chunk; a prompt that was prefilled stays
// cached.
func (r *shadow) ended(t *ticket) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unqueueLocked(t)
	if !t.done {
		t.done = true
		r.model.Release(t.hold, t.promptTokens, &r.d)
		r.creditLocked(len(r.d.Evicted))
	}
	r.publishLocked()
}

// queue is the prefill this node dispatched to the server and has not seen start, and what
// of it is ahead of each class when the server schedules by priority (engine.State's fields).
type queue struct {
	total, beforeHigh, lowWaiting int
}

// queuedTokens splits the queued prefill by class. The server does not say which of these
// prompts it has begun to prefill (a request shows only with its first token), so the split
// takes the earliest dispatched one as the prefill running now, ahead of every class whatever
// its own (a running prefill's chunks take each step's budget first), and every other one as
// waiting in its class: an engine with a queue admits one prompt at a time into the step's
// budget, and the oldest one is the likeliest to be it.
func (r *shadow) queuedTokens() queue {
	r.mu.Lock()
	defer r.mu.Unlock()
	q := queue{total: r.queued, beforeHigh: r.queuedHigh, lowWaiting: r.queuedLow}
	if f := r.order.Front(); f != nil {
		if t := f.Value.(*ticket); t.priority <= 0 {
			q.beforeHigh += t.uncached
			if t.priority < 0 {
				q.lowWaiting -= t.uncached
			}
		}
	}
	return q
}

// resident lists the model's blocks, or only its anchors, least recently used first.
func (r *shadow) resident(anchors bool) []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if anchors {
		return r.model.ResidentAnchors(nil)
	}
	return r.model.Resident(make([]uint64, 0, r.model.Len()))
}

// scraped follows one scrape (m nil when it failed) and the state it left: the server's KV
// capacity and block size, and whether it restarted, which empties the model.
//
// One restart is one reset. Three signs show a restart: the process start time changed, the
// prompt token counter went back, or health returned after it failed. Each compares with
// what the instance before showed, so a reset drops what earlier scrapes showed and keeps
// only this scrape's, the new instance's: a counter a server exports only after its first
// request, reappearing below the old instance's figure, is no second restart, nor is health
// returning after a restart already seen. Health returning to an unchanged start time is
// still taken for a restart: the process exporting it may not be the one holding the cache
// (a front process, a proxy), and forgetting costs a preference, never a wrong route.
func (r *shadow) scraped(m map[string][]sample, st engine.State) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var restart string
	sawStart, sawPrompts := false, false
	if m != nil {
		if v, ok := sum(m, processStart); ok {
			if r.haveStart && v != r.start {
				restart = "process start time changed"
			}
			r.start, r.haveStart, sawStart = v, true, true
		}
		// A prompt token counter going back means the server restarted.
		if name := kinds[r.kind].prompt; name != "" {
			if v, ok := sum(m, name); ok {
				if r.havePrompts && v < r.prompts {
					restart = "prompt token counter went back"
				}
				r.prompts, r.havePrompts, sawPrompts = v, true, true
			}
		}
		r.engineBlock = engineBlockTokens(m, r.kind)
	}
	if st.Healthy && !r.healthy && r.everHealthy && restart == "" {
		restart = "healthy again"
	}
	r.healthy = st.Healthy
	if restart != "" {
		// The instance is new: its own figures are this scrape's, and it has yet to be healthy
		// (being so now is not a return).
		r.haveStart, r.havePrompts, r.everHealthy = sawStart, sawPrompts, false
		n := r.model.Len()
		r.model.Clear(&r.d)
		r.resets.Inc()
		r.log.Warn("engine restarted: its prefix cache is empty", "reason", restart, "blocks_forgotten", n)
	}
	r.everHealthy = r.everHealthy || st.Healthy
	if st.KVBlocksTotal > 0 && st.KVBlocksTotal != r.model.Capacity() {
		r.model.SetCapacity(st.KVBlocksTotal, &r.d)
	}
	r.publishLocked()
}

// engineBlockTokens is the server's KV block size in its tokens, from its cache_config_info
// (vLLM's block_size, SGLang's page_size) or its block size gauge (newer SGLang's page_size),
// or 0.
func engineBlockTokens(m map[string][]sample, kind string) int {
	names := kinds[kind]
	for _, s := range m[names.cacheInfo] {
		if v, err := strconv.Atoi(s.labels[names.sizeLabel]); err == nil && v > 0 {
			return v
		}
	}
	if v, ok := mean(m, names.blockGauge); ok && v >= 1 {
		return int(v)
	}
	return 0
}

// ResidentBlocks returns the block hashes the residency model says the server holds, least
// recently used first.
func (e *Engine) ResidentBlocks() []uint64 { return e.res.resident(false) }

// ResidentAnchors returns those of ResidentBlocks that are anchors of their chains
// (kvindex.Anchor), in the same order: this node's prefix snapshot for gossip's push/pull.
func (e *Engine) ResidentAnchors() []uint64 { return e.res.resident(true) }

// Generate forwards req to the engine and returns once the engine answered 200 and its stream
// is open. From dispatch to its first token the request's uncached prompt tokens (by the
// residency model's prediction) count as queued prefill; its stream reports the first token
// and the usage to the model.
func (e *Engine) Generate(ctx context.Context, req *engine.Request) (engine.Stream, error) {
	t := e.res.dispatch(req)
	st, err := e.generate(ctx, req)
	if err != nil {
		e.res.ended(t)
		return nil, err
	}
	inner, _ := st.(*stream)
	var out engine.Stream = &trackedStream{Stream: st, inner: inner, res: e.res, t: t}
	if req.Resume != nil {
		out = &resumedStream{Stream: out, r: req.Resume} // the residency model reads the server's own usage
	}
	return out, nil
}

// trackedStream tells the residency model what the server's stream says: the first token and
// the usage.
type trackedStream struct {
	engine.Stream
	inner *stream
	res   *shadow
	t     *ticket
	first bool // only Recv's goroutine reads and writes it
}

func (s *trackedStream) Recv() (engine.Chunk, error) {
	c, err := s.Stream.Recv()
	if err != nil {
		s.res.ended(s.t)
		return c, err
	}
	if !s.first {
		s.first = true
		s.res.prefilled(s.t)
	}
	if c.Usage != nil {
		s.res.finished(s.t, c.Usage, s.inner != nil && s.inner.cachedReported)
	}
	return c, nil
}

// Close cancels the generation; safe twice, after io.EOF, and from another goroutine.
func (s *trackedStream) Close() error {
	err := s.Stream.Close()
	s.res.ended(s.t)
	return err
}
