package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node/engine"
)

// Errors.
var (
	// ErrClosed fails Generate after Close and every stream still in flight at Close.
	ErrClosed = fmt.Errorf("sim: closed: %w", engine.ErrUnavailable)
	// ErrStreamClosed is what Recv returns after the caller closed the stream.
	ErrStreamClosed = errors.New("sim: stream closed")
	// ErrCacheInUse: ResetPrefixCache was called while requests run or wait.
	ErrCacheInUse = errors.New("sim: the prefix cache is in use by running or waiting requests")
)

type seqState uint8

const (
	waiting seqState = iota
	running
	done
)

// seq is one request inside the engine.
type seq struct {
	id           uint64 // arrival order: within a priority, preemption picks the highest running id
	priority     int    // engine.Request.Priority (0 under fcfs): higher is scheduled first, preempted last
	model        string
	adapter      string   // the LoRA adapter model names, "" for a base model's request
	blocks       []uint64 // full prompt blocks' chained hashes
	promptTokens int
	maxTokens    int // the cap on the whole generation: a resumed one's base tokens count
	natural      int
	base         int // tokens an earlier engine generated before a resume (engine.Resume)
	usagePrompt  int // the prompt tokens Usage reports: a resumed generation's original's
	minTokens    int // stop sequences are looked for only from this many tokens on
	tseed        uint64
	out          *output
	logprobs     bool             // score each output token
	topLogprobs  int              // list this many of the likeliest tokens at each position
	lp           []engine.Logprob // scores of tokens generated since the last chunk
	call         *toolCall        // the tool call the output is, nil for text (tools.go)

	state     seqState
	gen       int // tokens generated so far (kept across preemption)
	computed  int // tokens whose KV is in the cache
	shared    int // blocks[:shared] are referenced in the prefix cache
	own       int // private blocks held
	estHit    int // cache-hit tokens expected when waiting (for QueuedPrefillTokens)
	scheduled bool
	cached    int // CachedTokens reported in Usage: hits at first scheduling

	// Roles (roles.go). prefillOnly: a prefill engine's request, ended by a handover once its
	// prompt is computed. kvIn: a handover whose KV has not arrived; transferring while it
	// crosses the link (admitted), until xferEnd, xfer after admission.
	prefillOnly  bool
	kvIn         bool
	transferring bool
	xfer         time.Duration
	xferEnd      time.Duration

	arrivalSim  time.Duration
	arrivalWall time.Time
	stream      *Stream
	stopCtx     func() bool
}

type planItem struct {
	q *seq
	n int
}

// Sim is the simulated engine. Create it with New.
type Sim struct {
	cfg      Config
	kvBlocks int
	models   map[string]engine.Model
	log      *slog.Logger
	met      *metrics

	wake chan struct{}
	done chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	started bool
	closed  bool
	nextID  uint64
	cache   *blockCache
	running []*seq // sorted by runOrder: priority, then id
	waiting []*seq // head first: priority, then arrival (see enqueueLocked)
	plan    []planItem
	simNow  time.Duration
	// Recent prompt tokens and their cache hits, for HitRate.
	hitWin        []hitSample
	hitTok, hitOK int
	delta         kvindex.CacheDelta // the step's changes to the prefix cache, for OnPrefix
	lora          loraState
	// Counters exported as vLLM metrics.
	nPreempt, nQueries, nHits, nPrompt, nGen uint64
}

type hitSample struct{ tokens, hits int }

var _ engine.Engine = (*Sim)(nil)

// New validates cfg, fills its defaults and builds a Sim. It starts no goroutine: the step
// loop starts with Start or the first Generate.
func New(cfg Config) (*Sim, error) {
	cfg.fill()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	n, err := cfg.kvBlocks()
	if err != nil {
		return nil, err
	}
	s := &Sim{
		cfg:      cfg,
		kvBlocks: n,
		models:   make(map[string]engine.Model, len(cfg.Models)),
		log:      cfg.Logger,
		wake:     make(chan struct{}, 1),
		done:     make(chan struct{}),
		cache:    newBlockCache(n),
		lora:     newLoRAState(&cfg),
	}
	s.cfg.Models = slices.Clone(cfg.Models)
	for _, m := range cfg.Models {
		s.models[m.Name] = m
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.met = newMetrics(s)
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(s.met); err != nil {
			return nil, fmt.Errorf("sim: register metrics: %w", err)
		}
	}
	return s, nil
}

// KVBlocks returns the pool size in blocks (configured or derived).
func (s *Sim) KVBlocks() int { return s.kvBlocks }

// Start starts the step loop if it is not running. Generate calls it, so calling it is
// optional. It does nothing after Close.
func (s *Sim) Start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.startLocked()
}

func (s *Sim) startLocked() {
	if s.started || s.closed {
		return
	}
	s.started = true
	s.wg.Add(1)
	go s.loop()
}

// Close stops the step loop, fails every in-flight stream with ErrClosed and unregisters the
// metrics. Safe twice.
func (s *Sim) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	s.mu.Unlock()
	s.wg.Wait()

	s.mu.Lock()
	all := append(slices.Clone(s.running), s.waiting...)
	for _, q := range all {
		s.dropLocked(q)
	}
	s.mu.Unlock()
	for _, q := range all {
		q.stream.end(ErrClosed)
	}
	if s.cfg.Registerer != nil {
		// A node that replaces its engine can register the next one on the same registry.
		s.cfg.Registerer.Unregister(s.met)
	}
	s.log.Debug("sim: closed", "failed_streams", len(all))
	return nil
}

// Generate queues req and returns its stream. A request for a LoRA adapter runs on the
// adapter's base model (lora.go). It refuses, wrapping engine.ErrRejected, an
// unknown model, max_tokens < 1, a request over the model's context, one whose prompt plus
// max_tokens needs more blocks than the whole pool (it could never run), a Resume whose
// tokens and max_tokens are over the model's context, and (an
// *engine.ParamError) an extra field or a role it cannot honour (see params.go).
func (s *Sim) Generate(ctx context.Context, req *engine.Request) (engine.Stream, error) {
	st, err := s.submit(ctx, req)
	if err != nil {
		return nil, err
	}
	s.Start()
	return st, nil
}

// submit does Generate's work without starting the loop (benchmarks drive steps directly).
func (s *Sim) submit(ctx context.Context, req *engine.Request) (*Stream, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	m, adapter, ok := s.resolve(req.Model)
	if !ok {
		return nil, fmt.Errorf("sim: unknown model %q: %w", req.Model, engine.ErrRejected)
	}
	if req.MaxTokens < 1 {
		return nil, fmt.Errorf("sim: max_tokens %d < 1: %w", req.MaxTokens, engine.ErrRejected)
	}
	opts, err := checkRequest(req)
	if err != nil {
		return nil, err
	}
	p := req.PromptTokens
	if p <= 0 {
		p = kvindex.Tokens(len(req.Prompt))
	}
	p = max(p, 1) // an empty prompt still has a start token to compute
	if p+req.MaxTokens > m.ContextTokens {
		return nil, fmt.Errorf("sim: %d prompt + %d max tokens over the %d-token context: %w",
			p, req.MaxTokens, m.ContextTokens, engine.ErrRejected)
	}
	if r := req.Resume; r != nil && (r.Tokens < 0 || r.Bytes < 0 || r.Tokens+req.MaxTokens > m.ContextTokens) {
		return nil, fmt.Errorf("sim: resuming %d tokens + %d max tokens over the %d-token context: %w",
			r.Tokens, req.MaxTokens, m.ContextTokens, engine.ErrRejected)
	}
	if err := s.checkRole(req, p); err != nil {
		return nil, err
	}
	bt := s.cfg.BlockTokens
	prefillOnly := s.cfg.Role == RolePrefill || req.PrefillOnly
	held := p + req.MaxTokens
	if prefillOnly {
		held = p // the engine holds only the prompt's KV
	}
	if need := (held + bt - 1) / bt; need > s.kvBlocks {
		return nil, fmt.Errorf("sim: request needs %d KV blocks, pool has %d: %w", need, s.kvBlocks, engine.ErrRejected)
	}
	blocks := req.Blocks
	if blocks == nil { // seeded by the model the request names: an adapter's are its own
		blocks = kvindex.AppendBlocks(nil, req.Model, req.Prompt, bt)
	}
	// Never more full blocks than the token count allows (PromptTokens may be given).
	blocks = blocks[:min(len(blocks), p/bt)]
	tseed, total, usagePrompt := textSeed(req.Seed, req.Prompt), req.MaxTokens, p
	if r := req.Resume; r != nil {
		tseed, total = resumeSeed(r), req.MaxTokens+r.Tokens
		if r.PromptTokens > 0 {
			usagePrompt = r.PromptTokens
		}
	}
	natural := naturalLength(tseed, total)
	if opts.ignoreEOS {
		natural = total
	}
	natural = max(natural, opts.minTokens)
	call, err := forcedCall(req, tseed)
	if err != nil {
		return nil, err
	}
	if call != nil {
		natural = len(call.pieces)
	}
	q := &seq{
		model:        req.Model,
		adapter:      adapter,
		blocks:       blocks,
		promptTokens: p,
		maxTokens:    total,
		priority:     s.schedPriority(req.Priority),
		natural:      natural,
		minTokens:    opts.minTokens,
		tseed:        tseed,
		out:          newOutput(req.Stop, opts.includeStop),
		logprobs:     req.Logprobs,
		topLogprobs:  req.TopLogprobs,
		call:         call,
		usagePrompt:  usagePrompt,
		arrivalWall:  time.Now(),
		prefillOnly:  prefillOnly,
	}
	if h := req.Handover; h != nil {
		q.kvIn, q.xfer, q.cached = true, s.transferTime(h), h.CachedTokens
	}
	if r := req.Resume; r != nil {
		q.base = replay(q.out, tseed, r.Bytes, opts.minTokens, min(total, natural)-1)
	}
	st := newStream(s)
	st.seq, q.stream = q, st
	if req.Echo && !prefillOnly {
		st.echo = &echo{prompt: req.Prompt, logprobs: req.Logprobs, top: req.TopLogprobs, seed: tseed}
	}

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	s.nextID++
	q.id = s.nextID
	q.arrivalSim = s.simNow
	q.estHit, _ = s.cache.lookup(q.blocks, (p-1)/bt)
	q.estHit *= bt
	if q.kvIn {
		q.estHit = p - 1 // only the last prompt token is computed here
	}
	s.enqueueLocked(q)
	s.mu.Unlock()

	// The callback may run at once (ctx already done) on another goroutine, and dropLocked
	// reads stopCtx under the lock: set it under the lock too.
	stop := context.AfterFunc(ctx, func() { s.cancel(q, fmt.Errorf("sim: %w", ctx.Err())) })
	s.mu.Lock()
	q.stopCtx = stop
	finished := q.state == done
	s.mu.Unlock()
	if finished {
		stop()
	}
	s.kick()
	return st, nil
}

// schedPriority is the priority the scheduler orders a request of priority p by: p itself
// under SchedulingPriority, and 0 for every request under SchedulingFCFS, which makes the
// scheduler first come, first served (see the queues' order in sched.go).
func (s *Sim) schedPriority(p int) int {
	if s.cfg.SchedulingPolicy == SchedulingFCFS {
		return 0
	}
	return p
}

func (s *Sim) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// cancel takes q out of the engine and ends its stream with err.
func (s *Sim) cancel(q *seq, err error) {
	s.mu.Lock()
	if q.state == done {
		s.mu.Unlock()
		return
	}
	s.dropLocked(q)
	s.mu.Unlock()
	q.stream.end(err)
	s.kick() // freed blocks may let a waiting request in
}

// dropLocked frees q's blocks and removes it from whichever queue holds it.
func (s *Sim) dropLocked(q *seq) {
	switch q.state {
	case waiting:
		if i := slices.Index(s.waiting, q); i >= 0 {
			s.waiting = slices.Delete(s.waiting, i, i+1)
		}
	case running:
		s.freeLocked(q)
		s.removeRunningLocked(q)
	}
	q.state = done
	if q.stopCtx != nil {
		q.stopCtx()
	}
}

func (s *Sim) freeLocked(q *seq) {
	s.cache.release(q.blocks[:q.shared])
	s.cache.freePrivate(q.own)
	q.shared, q.own, q.computed = 0, 0, 0
}

func (s *Sim) removeRunningLocked(q *seq) {
	i, ok := slices.BinarySearchFunc(s.running, q, runOrder)
	if ok {
		s.running = slices.Delete(s.running, i, i+1)
	}
}

func (s *Sim) insertRunningLocked(q *seq) {
	i, _ := slices.BinarySearchFunc(s.running, q, runOrder)
	s.running = slices.Insert(s.running, i, q)
}

// maxLag bounds how far the step loop may run behind its wall-clock schedule and still catch
// up by running steps back to back; a longer stall (a paused process) is forgotten.
const maxLag = 50 * time.Millisecond

// pace returns the wall-clock end of a step of wall duration d scheduled at now, after a
// previous step due at prev (zero: the engine was idle). A step starts where the previous one
// was due, so time lost since is made up, unless it is more than maxLag: then it starts now.
func pace(prev, now time.Time, d time.Duration) time.Time {
	if prev.IsZero() || now.Sub(prev) > maxLag {
		prev = now
	}
	return prev.Add(d)
}

// loop is the one goroutine: schedule a step, sleep until its scaled end, complete it.
//
// Steps are paced against a wall-clock schedule, not by sleeping each step's duration: the
// CPU time of scheduling and delivering tokens, and a busy host's late timer wake-ups, would
// otherwise add to every step, so a loaded machine would model a slower GPU than configured.
func (s *Sim) loop() {
	defer s.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var due time.Time // the scheduled wall-clock end of the previous step; zero when idle
	for {
		s.mu.Lock()
		d, ok := s.scheduleLocked()
		delta := s.delta // only this goroutine changes it
		s.mu.Unlock()
		s.report(delta)
		if !ok {
			due = time.Time{}
			select {
			case <-s.wake:
				continue
			case <-s.done:
				return
			}
		}
		now := time.Now()
		due = pace(due, now, time.Duration(float64(d)/s.cfg.TimeScale))
		timer.Reset(due.Sub(now))
		select {
		case <-timer.C:
		case <-s.done:
			return
		}
		s.mu.Lock()
		ends := s.completeLocked(d)
		delta = s.delta
		s.mu.Unlock()
		s.report(delta)
		for _, q := range ends {
			q.stream.end(io.EOF)
		}
	}
}
