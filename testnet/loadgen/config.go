package loadgen

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"slices"
	"time"
)

// Sentinel errors; returned errors wrap them.
var (
	// ErrConfig reports an invalid Config.
	ErrConfig = errors.New("loadgen: invalid config")
	// ErrTrace reports a malformed trace file; the message names the line.
	ErrTrace = errors.New("loadgen: malformed trace")
	// ErrUnknownWorkload reports a workload name that is not one of Workloads().
	ErrUnknownWorkload = errors.New("loadgen: unknown workload")
)

// Class is a priority class with its own SLOs. A completed request counts towards goodput when
// its TTFT ≤ TTFT and its TPOT ≤ TPOT.
type Class struct {
	Name string `json:"name"`
	// Priority is sent as X-Kvmesh-Priority: 0 as "normal", others as the integer (negative is
	// sheddable).
	Priority int           `json:"priority"`
	TTFT     time.Duration `json:"ttft_slo"`
	TPOT     time.Duration `json:"tpot_slo"`
}

// DefaultInteractive and DefaultBatch are the classes DefaultConfig uses.
var (
	DefaultInteractive = Class{Name: "interactive", Priority: 0, TTFT: 2 * time.Second, TPOT: 100 * time.Millisecond}
	DefaultBatch       = Class{Name: "batch", Priority: -1, TTFT: 30 * time.Second, TPOT: 500 * time.Millisecond}
)

// Config describes one load run.
type Config struct {
	// Targets are base URLs (http://host:port); requests are spread over them round-robin.
	Targets []string
	// Model is the "model" field of every request, unless Models is set.
	Model string
	// Models, if set, spreads the requests over several models, each served by some of the
	// Targets: a request asks for Models[Item.Conversation() mod len(Models)], so requests
	// that could reuse one another's prefix ask for one model, and is sent round-robin over all
	// Targets as without it. A request sent to one of its model's own Targets enters through
	// its own model's node (EntryOwn), any other through another model's (EntryOther); the
	// Report breaks the run down by entry (Report.Entries).
	Models []ModelTargets
	// Workload names a synthetic workload (see Workloads); ignored when Trace is set.
	Workload string
	// Trace is a Mooncake JSONL, Azure LLM inference CSV or BurstGPT CSV file to replay (the
	// format is sniffed; see ReadTraceFile).
	Trace string
	// Rate is the mean offered load in requests/s for synthetic workloads (for "agents" it
	// counts steps: sessions start at Rate/5.5 a second, the mean session length); for a trace
	// it multiplies the trace's own rate (0 means 1), so a benchmark can sweep loads.
	Rate float64
	// Duration bounds the arrival window: no request is started after it (0 = the whole trace;
	// a synthetic workload needs Duration or MaxRequests). Requests in flight are waited for.
	Duration time.Duration
	// Seed makes the workload deterministic.
	Seed int64
	// Speedup divides trace timestamps (2 = twice as fast); Scale multiplies trace token lengths
	// (0.1 = a tenth), block size included, so shared prefixes stay shared. With a Trace both
	// must be > 0 (DefaultConfig's are 1).
	Speedup float64
	Scale   float64
	// TraceBatchFraction marks this fraction of trace requests as Batch (chosen under Seed).
	TraceBatchFraction float64
	// MaxRequests caps the requests sent (0 = no cap).
	MaxRequests int
	// Concurrency caps requests in flight (0 = no cap).
	Concurrency int
	// Sessions, for the agents workload, keeps this many sessions running: the next planned
	// session starts as soon as one ends (a closed loop, as a platform with that many agent
	// workers runs), not at its planned arrival time, until Duration or the plan runs out.
	// Its throughput is CompletedInWindow over the Window, free of the drain after it. 0 =
	// arrivals as planned.
	Sessions int
	// Timeout bounds one request attempt, stream included.
	Timeout time.Duration
	// Retries is how many times a refusal carrying Retry-After (429 or 503) is retried, on the
	// next target, after waiting as told (capped by MaxRetryWait); 0 never retries.
	Retries int
	// MaxRetryWait caps an honoured Retry-After.
	MaxRetryWait time.Duration
	// BurstPeriod is the "bursty" workload's on/off cycle (0 means DefaultBurstPeriod, 4 s): a
	// run on a time-scaled engine scales it with the engine, so the bursts keep their shape.
	BurstPeriod time.Duration
	// ToolWait is the mean pause between an agent's steps (exponentially distributed).
	ToolWait time.Duration
	// ToolScale multiplies the size of an agent's tool results (100 to 800 tokens; 0 means 1).
	// Agents that read files or logs get thousands of tokens back a step, so their context,
	// and what losing it from the prefix cache costs, grows fast.
	ToolScale float64
	// SharedPrefix shapes the "shared-prefix" and "adapters" workloads (see SharedPrefix and
	// WorkloadAdapters; its zero fields take
	// DefaultSharedPrefix's values, but FollowUps and TenantZipf, whose zero means none).
	SharedPrefix SharedPrefix
	// Variant selects another stream of requests over the same shared texts: a synthetic
	// workload's requests (arrivals, classes, lengths, questions, tenants drawn) are drawn under
	// (Seed, Variant), while what its requests share (documents, repositories, tenants' system
	// prompts) is keyed by Seed alone. 0 is the stream every earlier release drew; a warm-up run
	// takes another Variant, so it warms what the measured run shares without sending its
	// requests. Ignored with a Trace.
	Variant uint64
	// Interactive and Batch are the two classes the workloads use.
	Interactive, Batch Class
	// HTTPClient sends the requests (nil = a client with a pooled transport, closed at the end).
	HTTPClient *http.Client
	// TLS configures that pooled transport's HTTPS to https targets (nil = the system roots).
	TLS *tls.Config
	// Requests receives one line of JSON per request as it ends (RequestRecord; nil = none).
	// Writes are serialized; the first write error ends nothing and is returned by Run.
	Requests io.Writer
	// RunLabel is every RequestRecord's "run" (`kvmesh bench` writes "POLICY@LOAD").
	RunLabel string
	// Observe, if set, is given every request's RequestRecord as it ends, as Requests is, from
	// the request's goroutine: it must be safe for concurrent use.
	Observe func(RequestRecord)
	// Progress receives a progress line every ProgressInterval (nil = none): redrawn in place
	// with carriage returns on a terminal, one line per update anywhere else.
	Progress         io.Writer
	ProgressInterval time.Duration
	// APIKey is sent as "Authorization: Bearer KEY" when set.
	APIKey string
	// FittedTTFT sends no TTFT header, so the mesh holds each request to its priority class's
	// default target fitted to the request's size (its own prefill time added), and judges its
	// TTFT by the target the mesh declares in the response (X-Kvmesh-TTFT-Target).
	FittedTTFT bool
	// NaturalLengths sends requests without "ignore_eos": the engine may end a reply before
	// max_tokens. By default every request asks for ignore_eos (vLLM's and SGLang's field, as
	// their benchmark clients do), so a reply is as long as the workload or trace says.
	NaturalLengths bool
	// Logger receives one line per failed request (nil = discard).
	Logger *slog.Logger
}

// ModelTargets is one model of Config.Models and the targets that serve it.
type ModelTargets struct {
	Name string `json:"name"`
	// Targets are the base URLs of the nodes serving the model, each one of Config.Targets.
	Targets []string `json:"targets"`
}

// Entries of a request with Config.Models: sent to a node serving its model, or to one that
// does not.
const (
	EntryOwn   = "own"
	EntryOther = "other"
)

// SharedPrefix shapes the "shared-prefix" workload: Tenants tenants, each with a system prompt
// every one of its requests carries byte for byte, then a question of its own; a FollowUps
// fraction of requests continue one of their tenant's conversations instead, their prompt the
// conversation's last prompt, its planned reply and a new question. Lengths are in tokens:
// tenant t's system prompt is SystemTokens × a factor in [0.75, 1.25] fixed by the seed and t,
// a question QuestionTokens × [0.5, 1.5] and a reply ReplyTokens × [0.75, 1.25], drawn per
// request. A request picks its tenant with probability ∝ (rank+1)^−TenantZipf (0: uniform).
type SharedPrefix struct {
	Tenants        int     `json:"tenants"`
	SystemTokens   int     `json:"system_tokens"`
	QuestionTokens int     `json:"question_tokens"`
	ReplyTokens    int     `json:"reply_tokens"`
	TenantZipf     float64 `json:"tenant_zipf"`
	FollowUps      float64 `json:"follow_ups"`
}

// DefaultSharedPrefix returns 150 tenants of ~3,000-token system prompts, ~200-token questions
// and ~400-token replies, uniform popularity, 30% follow-ups.
func DefaultSharedPrefix() SharedPrefix {
	return SharedPrefix{Tenants: 150, SystemTokens: 3000, QuestionTokens: 200, ReplyTokens: 400, FollowUps: 0.3}
}

// validate checks sp and fills its zero lengths and tenant count from DefaultSharedPrefix.
func (sp SharedPrefix) validate() (SharedPrefix, error) {
	if sp.Tenants < 0 || sp.SystemTokens < 0 || sp.QuestionTokens < 0 || sp.ReplyTokens < 0 {
		return sp, fmt.Errorf("%w: tenants and token lengths must be ≥ 0", ErrConfig)
	}
	if !(sp.TenantZipf >= 0) || sp.TenantZipf > 10 {
		return sp, fmt.Errorf("%w: tenant zipf %v must be in [0, 10]", ErrConfig, sp.TenantZipf)
	}
	if !(sp.FollowUps >= 0) || sp.FollowUps >= 1 {
		return sp, fmt.Errorf("%w: follow-up fraction %v must be in [0, 1)", ErrConfig, sp.FollowUps)
	}
	d := DefaultSharedPrefix()
	for _, f := range []struct{ v, def *int }{
		{&sp.Tenants, &d.Tenants}, {&sp.SystemTokens, &d.SystemTokens}, {&sp.QuestionTokens, &d.QuestionTokens}, {&sp.ReplyTokens, &d.ReplyTokens},
	} {
		if *f.v == 0 {
			*f.v = *f.def
		}
	}
	return sp, nil
}

// DefaultConfig returns a Config for a 30 s run of the mixed workload at 1 request/s; set
// Targets.
func DefaultConfig() Config {
	return Config{
		Model:            "sim",
		Workload:         "mixed",
		Rate:             1,
		Duration:         30 * time.Second,
		Seed:             1,
		Speedup:          1,
		Scale:            1,
		Timeout:          5 * time.Minute,
		MaxRetryWait:     30 * time.Second,
		ToolWait:         time.Second,
		SharedPrefix:     DefaultSharedPrefix(),
		Interactive:      DefaultInteractive,
		Batch:            DefaultBatch,
		ProgressInterval: time.Second,
	}
}

// validate checks cfg and fills the defaults a zero field stands for.
func (cfg Config) validate() (Config, error) {
	bad := func(format string, a ...any) (Config, error) {
		return cfg, fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, a...))
	}
	if len(cfg.Targets) == 0 {
		return bad("no targets")
	}
	for _, t := range cfg.Targets {
		u, err := url.Parse(t)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return bad("target %q is not an http(s) base URL", t)
		}
	}
	if cfg.Model == "" && len(cfg.Models) == 0 {
		return bad("no model")
	}
	if err := validModels(cfg.Models, cfg.Targets); err != nil {
		return cfg, err
	}
	if cfg.Trace == "" && cfg.Workload == "" {
		return bad("neither workload nor trace")
	}
	// NaN passes every comparison and would make arrivals garbage; +Inf, all at once. A trace
	// replayed at no speed or with no tokens is a mistake, not a request for the default.
	for _, f := range []struct {
		name     string
		v        float64
		positive bool
	}{{"rate", cfg.Rate, false}, {"speedup", cfg.Speedup, cfg.Trace != ""}, {"scale", cfg.Scale, cfg.Trace != ""}} {
		op := "≥"
		if f.positive {
			op = ">"
		}
		if !(f.v >= 0) || math.IsInf(f.v, 0) || (f.positive && f.v == 0) {
			return bad("%s %v must be a finite number %s 0", f.name, f.v, op)
		}
	}
	if cfg.Scale > 1 {
		return bad("scale %v must be in (0, 1]", cfg.Scale)
	}
	if cfg.ToolScale < 0 || cfg.ToolScale > 100 {
		return bad("tool scale %v must be in [0, 100]", cfg.ToolScale)
	}
	if cfg.Trace == "" && cfg.Rate == 0 {
		return bad("a synthetic workload needs a rate > 0")
	}
	if cfg.Trace == "" && cfg.Duration <= 0 && cfg.MaxRequests <= 0 {
		return bad("a synthetic workload needs a duration or max requests")
	}
	if cfg.Duration < 0 || cfg.MaxRequests < 0 || cfg.Concurrency < 0 || cfg.Sessions < 0 || cfg.Retries < 0 || cfg.Timeout < 0 || cfg.BurstPeriod < 0 {
		return bad("duration, max requests, concurrency, sessions, retries, timeout and burst period must be ≥ 0")
	}
	if cfg.Sessions > 0 && (cfg.Trace != "" || cfg.Workload != "agents" || cfg.Duration <= 0) {
		return bad("sessions needs the agents workload and a duration")
	}
	if cfg.TraceBatchFraction < 0 || cfg.TraceBatchFraction > 1 {
		return bad("trace batch fraction must be in [0, 1]")
	}
	sp, err := cfg.SharedPrefix.validate()
	if err != nil {
		return cfg, err
	}
	cfg.SharedPrefix = sp
	if cfg.Rate == 0 {
		cfg.Rate = 1
	}
	if cfg.Speedup == 0 {
		cfg.Speedup = 1
	}
	if cfg.Scale == 0 {
		cfg.Scale = 1
	}
	if cfg.ToolScale == 0 {
		cfg.ToolScale = 1
	}
	if cfg.BurstPeriod == 0 {
		cfg.BurstPeriod = DefaultBurstPeriod
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Minute
	}
	if cfg.MaxRetryWait == 0 {
		cfg.MaxRetryWait = 30 * time.Second
	}
	if cfg.ProgressInterval <= 0 {
		cfg.ProgressInterval = time.Second
	}
	if cfg.Interactive.Name == "" {
		cfg.Interactive = DefaultInteractive
	}
	if cfg.Batch.Name == "" {
		cfg.Batch = DefaultBatch
	}
	if cfg.Interactive.Name == cfg.Batch.Name {
		return bad("interactive and batch classes share the name %q", cfg.Batch.Name)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg, nil
}

// validModels checks Config.Models: names given and distinct, each model served by at least
// one of targets.
func validModels(models []ModelTargets, targets []string) error {
	seen := map[string]bool{}
	for _, m := range models {
		if m.Name == "" || seen[m.Name] {
			return fmt.Errorf("%w: model name %q empty or repeated", ErrConfig, m.Name)
		}
		seen[m.Name] = true
		if len(m.Targets) == 0 {
			return fmt.Errorf("%w: model %s has no targets", ErrConfig, m.Name)
		}
		for _, t := range m.Targets {
			if !slices.Contains(targets, t) {
				return fmt.Errorf("%w: model %s's target %q is not one of the targets", ErrConfig, m.Name, t)
			}
		}
	}
	return nil
}
