package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/node/engine"
	wire "github.com/kvmesh/kvmesh/node/openai"
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
	// Models served; if empty, Start fetches GET /v1/models, using each entry's max_model_len
	// when the server sends one and DefaultContextTokens otherwise.
	Models               []engine.Model
	DefaultContextTokens int
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
	// NominalKVBlocks is KVBlocksTotal when the server does not say its KV size.
	NominalKVBlocks int
	// AvgPromptTokens estimates QueuedPrefillTokens from the waiting count.
	AvgPromptTokens int
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
		ScrapeInterval:       time.Second,
		ScrapeTimeout:        time.Second,
		MaxScrapeFailures:    3,
		BlockTokens:          16,
		NominalKVBlocks:      4096,
		AvgPromptTokens:      512,
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

	mu       sync.Mutex
	models   []engine.Model
	state    engine.State
	fails    int
	lastHits float64
	lastQ    float64
	haveLast bool
	started  bool

	inflight atomic.Int64

	closeOnce sync.Once
	cancel    context.CancelFunc
	done      chan struct{}
}

var _ engine.Engine = (*Engine)(nil)

// Errors of this package.
var (
	// ErrTruncated: the stream ended before a chunk with a finish reason.
	ErrTruncated = errors.New("openai: engine stream ended without a finish reason")
	// ErrStream: the engine sent an error event in the middle of a stream.
	ErrStream = errors.New("openai: engine stream error")
	// ErrStarted: Start was called twice.
	ErrStarted = errors.New("openai: engine already started")
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
		return nil, fmt.Errorf("openai: unknown engine kind %q", cfg.Kind)
	}
	u, err := url.Parse(strings.TrimRight(cfg.BaseURL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("openai: base url %q must be http(s)://host[:port]", cfg.BaseURL)
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
	fill(&cfg.AvgPromptTokens, def.AvgPromptTokens)
	fill(&cfg.MaxRunning, def.MaxRunning)
	if cfg.ScrapeInterval == 0 {
		cfg.ScrapeInterval = def.ScrapeInterval
	}
	if cfg.ScrapeTimeout == 0 {
		cfg.ScrapeTimeout = min(cfg.ScrapeInterval, def.ScrapeTimeout)
	}
	if cfg.ScrapeInterval < 0 || cfg.ScrapeTimeout < 0 || cfg.DefaultContextTokens < 0 ||
		cfg.MaxScrapeFailures < 0 || cfg.BlockTokens < 0 || cfg.NominalKVBlocks < 0 || cfg.AvgPromptTokens < 0 {
		return nil, errors.New("openai: negative config value")
	}
	for _, m := range cfg.Models {
		if m.Name == "" || m.ContextTokens <= 0 {
			return nil, fmt.Errorf("openai: model %q needs a name and a positive context", m.Name)
		}
	}
	e := &Engine{cfg: cfg, base: u, client: cfg.HTTPClient, log: cfg.Logger,
		models: append([]engine.Model(nil), cfg.Models...)}
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
			return nil, fmt.Errorf("openai: registering metrics: %w", err)
		}
	}
	e.state = engine.State{BlockTokens: cfg.BlockTokens, KVBlocksTotal: cfg.NominalKVBlocks,
		PrefillTokensPerSecond: cfg.PrefillTokensPerSecond, DecodeStepSeconds: cfg.DecodeStepSeconds,
		MaxRunning: cfg.MaxRunning, Healthy: cfg.Kind == KindOpenAI}
	return e, nil
}

// Start fetches the model list if none was configured, scrapes once, and starts the scrape loop
// (none for kind "openai"). It fails if the model list cannot be fetched; a failed first scrape
// only leaves the engine unhealthy.
func (e *Engine) Start(ctx context.Context) error {
	e.mu.Lock()
	if e.started {
		e.mu.Unlock()
		return ErrStarted
	}
	e.started = true
	need := len(e.models) == 0
	e.mu.Unlock()
	if need {
		ms, err := e.fetchModels(ctx)
		if err != nil {
			return err
		}
		e.mu.Lock()
		e.models = ms
		e.mu.Unlock()
	}
	if e.cfg.Kind == KindOpenAI {
		return nil
	}
	e.scrape(ctx)
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

func (e *Engine) loop(ctx context.Context, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(e.cfg.ScrapeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			e.scrape(ctx)
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

// Models returns the models served.
func (e *Engine) Models() []engine.Model {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]engine.Model(nil), e.models...)
}

// State returns the latest scraped snapshot.
func (e *Engine) State() engine.State {
	e.mu.Lock()
	s := e.state
	e.mu.Unlock()
	if e.cfg.Kind == KindOpenAI {
		s.Running = int(e.inflight.Load())
	}
	return s
}

func (e *Engine) url(path string) string { return e.base.String() + path }

func (e *Engine) fetchModels(ctx context.Context) ([]engine.Model, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.url("/v1/models"), nil)
	if err != nil {
		return nil, fmt.Errorf("openai: models request: %w", err)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("openai: fetching models: %w: %w", engine.ErrUnavailable, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("openai: fetching models: status %d: %w", resp.StatusCode, engine.ErrUnavailable)
	}
	var list wire.ModelList
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&list); err != nil {
		return nil, fmt.Errorf("openai: decoding models: %w", err)
	}
	var ms []engine.Model
	for _, m := range list.Data {
		if m.ID == "" {
			continue
		}
		ctxTokens := m.MaxModelLen
		if ctxTokens <= 0 {
			ctxTokens = e.cfg.DefaultContextTokens
		}
		ms = append(ms, engine.Model{Name: m.ID, ContextTokens: ctxTokens})
	}
	if len(ms) == 0 {
		return nil, errors.New("openai: engine lists no models")
	}
	return ms, nil
}

// StatusError is an HTTP error answer from the engine before any output. It wraps
// engine.ErrRejected for 4xx and engine.ErrUnavailable for 5xx, and keeps the engine's status
// and OpenAI error fields so the node can relay a 4xx as is.
type StatusError struct {
	Status  int
	Message string
	Type    string
	Param   string
	Code    string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("openai: engine answered %d: %s", e.Status, e.Message)
}

// HTTPStatus is the engine's status code.
func (e *StatusError) HTTPStatus() int { return e.Status }

// Unwrap gives the engine sentinel.
func (e *StatusError) Unwrap() error {
	if e.Status >= 400 && e.Status < 500 {
		return engine.ErrRejected
	}
	return engine.ErrUnavailable
}

// APIError returns the error to send the client: the engine's own for a 4xx, a 502
// engine_error for anything else.
func (e *StatusError) APIError() *wire.Error {
	if e.Status < 400 || e.Status >= 500 {
		return wire.ErrEngine(e.Error())
	}
	code := e.Code
	if code == "" {
		code = wire.CodeInvalidRequest
	}
	out := wire.NewError(e.Status, code, e.Message)
	out.Param = e.Param
	return out
}

func statusError(resp *http.Response) *StatusError {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	se := &StatusError{Status: resp.StatusCode}
	var body struct {
		Error json.RawMessage `json:"error"`
		// TGI and some others send {"error":"msg","error_type":"..."}; vLLM's older builds send
		// {"message":...} at the top.
		Message   string `json:"message"`
		ErrorType string `json:"error_type"`
	}
	if json.Unmarshal(b, &body) == nil {
		var d struct {
			Message string          `json:"message"`
			Type    string          `json:"type"`
			Param   *string         `json:"param"`
			Code    json.RawMessage `json:"code"`
		}
		var s string
		switch {
		case json.Unmarshal(body.Error, &d) == nil && d.Message != "":
			se.Message, se.Type = d.Message, d.Type
			if d.Param != nil {
				se.Param = *d.Param
			}
			var code string
			if json.Unmarshal(d.Code, &code) == nil {
				se.Code = code
			}
		case json.Unmarshal(body.Error, &s) == nil && s != "":
			se.Message, se.Type = s, body.ErrorType
		case body.Message != "":
			se.Message = body.Message
		}
	}
	if se.Message == "" {
		se.Message = strings.TrimSpace(string(b))
		if se.Message == "" {
			se.Message = http.StatusText(resp.StatusCode)
		}
	}
	return se
}

// Generate forwards req to the engine and returns once the engine answered 200 and its stream
// is open.
func (e *Engine) Generate(ctx context.Context, req *engine.Request) (engine.Stream, error) {
	path := "/v1/chat/completions"
	if req.Endpoint == engine.Completion {
		path = "/v1/completions"
	}
	body, err := ForceStreaming(req)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	hreq, err := http.NewRequestWithContext(sctx, http.MethodPost, e.url(path), bytes.NewReader(body))
	if err != nil {
		cancel()
		return nil, fmt.Errorf("openai: building request: %w", err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "text/event-stream")
	if req.ID != "" {
		hreq.Header.Set("X-Request-Id", req.ID)
	}
	resp, err := e.client.Do(hreq)
	if err != nil {
		cancel()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("openai: request cancelled: %w", ctx.Err())
		}
		return nil, fmt.Errorf("openai: %w: %w", engine.ErrUnavailable, err)
	}
	if resp.StatusCode != http.StatusOK {
		se := statusError(resp)
		resp.Body.Close()
		cancel()
		e.log.Debug("engine refused request", "id", req.ID, "status", se.Status, "message", se.Message)
		return nil, se
	}
	e.inflight.Add(1)
	s := &stream{ctx: sctx, cancel: cancel, body: resp.Body, sse: wire.NewSSEReader(resp.Body),
		onClose: func() { e.inflight.Add(-1) }}
	return s, nil
}
