package external

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/engine/kvevents"
)

// Engine kinds: which metric names to scrape.
const (
	KindVLLM     = "vllm"
	KindSGLang   = "sglang"
	KindLlamaCpp = "llamacpp"
	KindTGI      = "tgi"
	KindOpenAI   = "openai"
)

// Config configures an Engine.
type Config struct {
	// BaseURL is the server's root, e.g. http://127.0.0.1:8000 (the /v1 paths are appended).
	BaseURL string
	// Kind is one of the Kind constants.
	Kind string
	// Models to serve, by name; empty serves whatever the server's GET /v1/models lists (see
	// models.go). A model's context is the server's max_model_len, else the configured
	// ContextTokens (0: none), else DefaultContextTokens.
	Models               []engine.Model
	DefaultContextTokens int
	// ModelsInterval is the period of the GET /v1/models refresh (default 30s); a failed fetch
	// is retried every ScrapeInterval.
	ModelsInterval time.Duration
	// ScrapeInterval is the period of the /metrics scrape; ScrapeTimeout bounds one scrape.
	ScrapeInterval time.Duration
	ScrapeTimeout  time.Duration
	// MaxScrapeFailures consecutive failed scrapes mark the engine unhealthy.
	MaxScrapeFailures int
	// HTTPClient is used for every request; nil means a client with no overall timeout (streams
	// are long) and the default transport.
	HTTPClient *http.Client
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// BlockTokens is the KV block size State reports in.
	BlockTokens int
	// NominalKVBlocks is KVBlocksTotal when the server does not say its KV size, and so the
	// residency model's capacity.
	NominalKVBlocks int
	// OnPrefix, if set, is called with the block hashes the residency model stored and evicted
	// (see ResidentBlocks), in order, and the anchors among them, with the model's lock held:
	// it must not block, must not call back into the Engine and must not keep the slices.
	OnPrefix func(kvindex.CacheDelta)
	// Priority sends each request's priority to the server in vLLM's priority field
	// (SetPriority: kvmesh's priority negated, a client's own value replaced), and makes State
	// report PriorityScheduling with the queued prefill split by class (see queuedTokens). Only
	// for KindVLLM, which must run with --scheduling-policy priority: without it vLLM refuses
	// a non-zero priority. Off, a client's priority member is removed (dropPriority).
	Priority bool
	// KVEvents is the server's KV cache event publisher (vLLM's and SGLang's
	// --kv-events-config endpoint): tcp://host:port dials it, bind:tcp://host:port listens
	// for a publisher that dials (kvevents.Config.Endpoint); empty, the default, reads none.
	// Its events drive the residency model's evictions (kvevents.go).
	KVEvents string
	// Messages says whether the server serves the Anthropic Messages API natively (POST
	// /v1/messages): MessagesOn, MessagesOff, or MessagesAuto (also ""), which asks the
	// server once (probeMessages). See ServesMessages.
	Messages string
	// Passed through to State; engines do not export them.
	PrefillTokensPerSecond float64
	DecodeStepSeconds      float64
	MaxRunning             int
}

// DefaultConfig returns a vLLM configuration for BaseURL http://127.0.0.1:8000.
func DefaultConfig() Config {
	return Config{
		BaseURL:              "http://127.0.0.1:8000",
		Kind:                 KindVLLM,
		DefaultContextTokens: 8192,
		ModelsInterval:       30 * time.Second,
		ScrapeInterval:       time.Second,
		ScrapeTimeout:        time.Second,
		MaxScrapeFailures:    3,
		BlockTokens:          16,
		NominalKVBlocks:      4096,
		MaxRunning:           256,
	}
}

// Engine is an external OpenAI-compatible server.
type Engine struct {
	cfg    Config
	base   *url.URL
	client *http.Client
	log    *slog.Logger

	scrapeErrors prometheus.Counter
	res          *shadow              // the residency model (residency.go)
	sub          *kvevents.Subscriber // the server's KV events, with Config.KVEvents

	mu       sync.Mutex
	models   []engine.Model
	state    engine.State
	fails    int
	lastHits float64
	// The prefill counters at the last scrape and the rate learned from them
	// (measurePrefillLocked).
	lastPrompt, lastPromptHits float64
	prefillAt                  time.Time
	lastWaiting                int
	prefillRate                float64
	lastQ                      float64
	haveLast                   bool
	started                    bool

	// Model discovery (models.go), under mu. models are those served: the configured ones
	// until the first good fetch. modelsErr is why the model list makes the engine unhealthy
	// (nil: it does not); modelFails counts failed fetches in a row; modelsKnown is set by the
	// first good fetch; lastMissing is the configured names last found missing, as logged.
	modelsErr   error
	modelFails  int
	modelsKnown bool
	lastMissing string

	inflight atomic.Int64
	// messages is what the server said of /v1/messages (messagesUnknown until it answered the
	// probe, with MessagesAuto).
	messages atomic.Int32

	closeOnce sync.Once
	cancel    context.CancelFunc
	done      chan struct{}
}

var _ engine.Engine = (*Engine)(nil)

// Errors of this package.
var (
	// ErrTruncated: the stream ended before a chunk with a finish reason.
	ErrTruncated = errors.New("external: engine stream ended without a finish reason")
	// ErrStream: the engine sent an error event in the middle of a stream.
	ErrStream = errors.New("external: engine stream error")
	// ErrStarted: Start was called twice.
	ErrStarted = errors.New("external: engine already started")
)

// New validates cfg, filling zero fields from DefaultConfig. It does no I/O.
func New(cfg Config) (*Engine, error) {
	def := DefaultConfig()
	if cfg.Kind == "" {
		cfg.Kind = def.Kind
	}
	switch cfg.Kind {
	case KindVLLM, KindSGLang, KindLlamaCpp, KindTGI, KindOpenAI:
	default:
		return nil, fmt.Errorf("external: unknown engine kind %q", cfg.Kind)
	}
	u, err := url.Parse(strings.TrimRight(cfg.BaseURL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("external: base url %q must be http(s)://host[:port]", cfg.BaseURL)
	}
	fill := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	fill(&cfg.DefaultContextTokens, def.DefaultContextTokens)
	fill(&cfg.MaxScrapeFailures, def.MaxScrapeFailures)
	fill(&cfg.BlockTokens, def.BlockTokens)
	fill(&cfg.NominalKVBlocks, def.NominalKVBlocks)
	fill(&cfg.MaxRunning, def.MaxRunning)
	cfg.ScrapeInterval = cmp.Or(cfg.ScrapeInterval, def.ScrapeInterval)
	cfg.ScrapeTimeout = cmp.Or(cfg.ScrapeTimeout, min(cfg.ScrapeInterval, def.ScrapeTimeout))
	cfg.ModelsInterval = cmp.Or(cfg.ModelsInterval, def.ModelsInterval)
	if cfg.ScrapeInterval < 0 || cfg.ScrapeTimeout < 0 || cfg.ModelsInterval < 0 || cfg.DefaultContextTokens < 0 ||
		cfg.MaxScrapeFailures < 0 || cfg.BlockTokens < 0 || cfg.NominalKVBlocks < 0 {
		return nil, errors.New("external: negative config value")
	}
	if err := checkMessages(cfg.Messages); err != nil {
		return nil, err
	}
	if cfg.Priority && cfg.Kind != KindVLLM {
		return nil, fmt.Errorf("external: request priority is sent only to a %s engine, not %s", KindVLLM, cfg.Kind)
	}
	models := make([]engine.Model, 0, len(cfg.Models))
	for _, m := range cfg.Models {
		if m.Name == "" || m.ContextTokens < 0 {
			return nil, fmt.Errorf("external: model %q needs a name and a context of 0 (the engine's) or more", m.Name)
		}
		if m.ContextTokens == 0 {
			m.ContextTokens = cfg.DefaultContextTokens
		}
		models = append(models, m)
	}
	e := &Engine{cfg: cfg, base: u, client: cfg.HTTPClient, log: cfg.Logger,
		models: models, modelsErr: errModelsNotFetched}
	if e.client == nil {
		e.client = &http.Client{}
	}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	e.scrapeErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_engine_scrape_errors_total",
		Help: "Failed scrapes of the external engine's /metrics.",
	})
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(e.scrapeErrors); err != nil {
			return nil, fmt.Errorf("external: registering metrics: %w", err)
		}
	}
	if e.res, err = newShadow(cfg, e.log); err != nil {
		return nil, err
	}
	if cfg.KVEvents != "" {
		e.sub, err = kvevents.NewSubscriber(kvevents.Config{Endpoint: cfg.KVEvents, OnBatch: e.res.onKVBatch,
			RetryInterval: cfg.ScrapeInterval, Logger: e.log, Registerer: cfg.Registerer})
		if err != nil {
			return nil, fmt.Errorf("external: %w", err)
		}
	}
	e.state = engine.State{BlockTokens: cfg.BlockTokens, KVBlocksTotal: cfg.NominalKVBlocks,
		PrefillTokensPerSecond: cfg.PrefillTokensPerSecond, DecodeStepSeconds: cfg.DecodeStepSeconds,
		MaxRunning: cfg.MaxRunning, Healthy: cfg.Kind == KindOpenAI}
	return e, nil
}

// Start fetches the model list, scrapes once, and starts the loop that refreshes both (no
// scrape for kind "openai"). It fails only when the server answers and does not list a
// configured model (ErrModelNotServed); a server that does not answer leaves the engine
// unhealthy until a later fetch succeeds.
func (e *Engine) Start(ctx context.Context) error {
	e.mu.Lock()
	if e.started {
		e.mu.Unlock()
		return ErrStarted
	}
	e.started = true
	e.mu.Unlock()
	if err := e.refreshModels(ctx, true); err != nil {
		if errors.Is(err, ErrModelNotServed) {
			return err
		}
		e.log.Warn("engine not reachable at start; unready until it answers", "engine", e.base.String(), "err", err)
	}
	if e.cfg.Kind != KindOpenAI {
		e.scrape(ctx)
	}
	e.probeMessages(ctx)
	loopCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cancel != nil { // Close ran meanwhile
		cancel()
		return nil
	}
	e.cancel, e.done = cancel, done
	go e.loop(loopCtx, done)
	return nil
}

// loop scrapes /metrics every ScrapeInterval (not for kind "openai") and refreshes the model
// list when nextModelsFetch says, and runs the KV event subscriber, until ctx ends.
func (e *Engine) loop(ctx context.Context, done chan struct{}) {
	defer close(done)
	if e.sub != nil {
		subDone := make(chan struct{})
		go func() {
			defer close(subDone)
			_ = e.sub.Run(ctx) // it logs and counts its own failures
		}()
		defer func() { <-subDone }()
	}
	var scrapes <-chan time.Time
	if e.cfg.Kind != KindOpenAI {
		t := time.NewTicker(e.cfg.ScrapeInterval)
		defer t.Stop()
		scrapes = t.C
	}
	models := time.NewTimer(e.nextModelsFetch())
	defer models.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-scrapes:
			e.scrape(ctx)
		case <-models.C:
			_ = e.refreshModels(ctx, false) // logged and counted inside
			e.probeMessages(ctx)            // until the server has answered it once
			models.Reset(e.nextModelsFetch())
		}
	}
}

// Close stops the scrape loop. It is safe to call twice and before Start.
func (e *Engine) Close() error {
	e.closeOnce.Do(func() {
		e.mu.Lock()
		cancel, done := e.cancel, e.done
		e.started = true // no Start after Close
		if cancel == nil {
			e.cancel = func() {} // tells a concurrent Start not to begin the loop
		}
		e.mu.Unlock()
		if done != nil {
			cancel()
			<-done
		}
	})
	return nil
}

// Models returns the models served: those of the server's last good list (see models.go).
func (e *Engine) Models() []engine.Model {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]engine.Model(nil), e.models...)
}

// State returns the latest scraped snapshot. It is healthy only while the model list is too
// (see Health). Its queued prefill is what this node dispatched and has not seen the first
// token of, split by class with Config.Priority (see queuedTokens).
func (e *Engine) State() engine.State {
	e.mu.Lock()
	s := e.state
	s.Healthy = s.Healthy && e.modelsErr == nil
	e.mu.Unlock()
	if e.cfg.Kind == KindOpenAI {
		s.Running = int(e.inflight.Load())
	}
	q := e.res.queuedTokens()
	s.QueuedPrefillTokens = q.total
	if e.cfg.Priority {
		s.PriorityScheduling, s.QueuedBeforeHigh, s.QueuedLowWaiting = true, q.beforeHigh, q.lowWaiting
	}
	return s
}

func (e *Engine) url(path string) string { return e.base.String() + path }

// PriorityHeader carries a request's admitted priority to the engine, in kvmesh's convention.
const PriorityHeader = "X-Kvmesh-Priority"
