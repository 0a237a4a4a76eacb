package admit

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/internal/jsonconf"
)

// Duration is a time.Duration that JSON reads as a Go duration string ("60s", "250ms") or a
// number of seconds, and writes as a string.
type Duration time.Duration

// MarshalJSON writes d as a Go duration string ("1m", "250ms").
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(jsonconf.FormatDuration(time.Duration(d)))
}

// UnmarshalJSON reads a duration string ("60s", "-1s") or a number of seconds. "0" reads as
// 0, which a Config takes as the setting's default; a negative value turns off the settings
// that document it.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var f float64
		if err := json.Unmarshal(b, &f); err != nil {
			return fmt.Errorf("admit: duration %s: want a string or seconds", b)
		}
		return d.setSeconds(f)
	}
	s = strings.TrimSpace(s)
	if f, err := strconv.ParseFloat(s, 64); err == nil && isPlainNumber(s) {
		return d.setSeconds(f)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("admit: duration %q: want a Go duration (\"60s\") or seconds", clip(s))
	}
	*d = Duration(v)
	return nil
}

func (d *Duration) setSeconds(f float64) error {
	if math.IsNaN(f) || math.Abs(f) > float64(math.MaxInt64)/float64(time.Second) {
		return fmt.Errorf("admit: duration %v out of range", f)
	}
	*d = Duration(f * float64(time.Second))
	return nil
}

// ModelConfig describes one model the mesh serves.
type ModelConfig struct {
	ContextTokens int `json:"context_tokens"`
	BlockTokens   int `json:"block_tokens,omitempty"` // KV block size; 0: 16 (vLLM's default)
	// DefaultMaxTokens and MaxMaxTokens override the Budget values for this model (the
	// per-route limits); 0: inherit.
	DefaultMaxTokens int `json:"default_max_tokens,omitempty"`
	MaxMaxTokens     int `json:"max_max_tokens,omitempty"`
}

// TenantConfig overrides per tenant; zero fields inherit the model's, then Budget's.
type TenantConfig struct {
	DefaultMaxTokens int `json:"default_max_tokens,omitempty"`
	MaxMaxTokens     int `json:"max_max_tokens,omitempty"`
}

// ValidationConfig bounds request parameters (layer 1). Each is at least 1 once filled.
type ValidationConfig struct {
	MaxN        int `json:"max_n"`        // default 1: one choice per request; n > 1 multiplies KV and decode work
	MaxStop     int `json:"max_stop"`     // default 4: OpenAI's limit on stop sequences
	MaxLogprobs int `json:"max_logprobs"` // default 20: OpenAI's top_logprobs limit
}

// BudgetConfig is layer 3.
type BudgetConfig struct {
	// DefaultMaxTokens fills an absent max_tokens (cut to the room left in the context): it is
	// the worst-case KV reservation of the request, so it stays well under the context window.
	// Default 1024.
	DefaultMaxTokens int `json:"default_max_tokens"`
	// MaxMaxTokens is the largest max_tokens accepted; 0: only the context limits it.
	// Default 0.
	MaxMaxTokens int `json:"max_max_tokens"`
	// ClampMaxTokens cuts a max_tokens above the maximum down to it instead of refusing
	// 400 invalid_parameter. Default false: a client that asked for more is told, not silently
	// truncated.
	ClampMaxTokens bool `json:"clamp_max_tokens"`
	// EstimateMinSamples finished requests of a (model, tenant), or of the model, are needed
	// before the learned output length replaces max_tokens in the KV reservation. Default 20.
	EstimateMinSamples int `json:"estimate_min_samples,advanced"`
	// EstimateAlpha is the EWMA weight of a new sample. Default 0.05 (about the last 20
	// requests dominate, so a tenant's change of habit is learned in a minute of traffic).
	EstimateAlpha float64 `json:"estimate_alpha,advanced"`
	// EstimateSigmas is how many standard deviations above the mean are reserved. Default 2
	// (roughly the 95th percentile, so under-reservation, and preemption, stays rare). Must be
	// positive.
	EstimateSigmas float64 `json:"estimate_sigmas,advanced"`
	// EstimateMaxSeries bounds the estimator's memory. Default 4096.
	EstimateMaxSeries int `json:"estimate_max_series,advanced"`
}

// KeyConfig is layer 2's default bucket for keys that name none.
type KeyConfig struct {
	// RateTokens per second and BurstTokens; 0 rate: unlimited. Defaults 0 and 0: the operator
	// sets limits per key in the key file; an unlimited default cannot surprise anyone.
	RateTokens  float64 `json:"rate_tokens_per_second"`
	BurstTokens int     `json:"burst_tokens"`
	// MaxPriority is the highest X-Kvmesh-Priority a request may ask for when its key names
	// no max_priority, or when no key file is loaded; a higher one is clamped to it (and the
	// response says so). nil: normal (0) for keys, unlimited for an open mesh, whose clients
	// are trusted (a development mesh).
	MaxPriority *int `json:"max_priority"`
}

// KVConfig is layer 4.
type KVConfig struct {
	// QueueOn: a fresh request is accepted on a candidate while its KV use after the request
	// stays ≤ QueueOn of its blocks. Default 0.95: leaves room for the running requests' growth.
	QueueOn float64 `json:"queue_on"`
	// QueueOff: a queued request is dispatched while use after it stays ≤ QueueOff. Default
	// 0.85, below QueueOn, so admission does not flap on late state (the hysteresis band).
	QueueOff float64 `json:"queue_off"`
	// Sheddable: a sheddable request (priority < 0) starts only while KV use after it stays ≤
	// Sheddable (or the mark above, if lower). Default 0.75: batch decodes hold their blocks for
	// seconds, so a burst of interactive requests finds a quarter of the pool still free.
	Sheddable float64 `json:"sheddable,advanced"`
	// DecodeQueueOn and DecodeQueueOff are the marks of the decode pool of a disaggregated
	// mesh (docs/design/disaggregation.md): a split request is accepted while its decode
	// node's KV use predicted for when the handover arrives, after the request, stays ≤
	// DecodeQueueOn, and dispatched from the room while it stays ≤ DecodeQueueOff. Defaults 0.9
	// and 0.8, five points under the whole request's marks: the check is a forecast one
	// prefill ahead, and a miss costs a prefill another node already spent.
	DecodeQueueOn  float64 `json:"decode_queue_on"`
	DecodeQueueOff float64 `json:"decode_queue_off"`
}

// QueueConfig is layers 5 and 6 and the waiting room. Zero fields take the defaults (in a
// file, a 0 for a setting DecodeConfig names is refused); the settings that can be turned off
// say which negative value does it.
type QueueConfig struct {
	// MaxRequests waiting per (model, role). Default 1024: a few seconds of a busy pool's
	// arrivals, bounded memory. Negative (-1) disables queueing: everything that cannot run at
	// once is refused.
	MaxRequests int `json:"max_requests"`
	// MaxTokens waiting (prefill tokens) per (model, role); 0: derived as TargetTTFT × the
	// pool's measured prefill rate (WaitingRoom.SetPrefillRate), or FallbackTokens before a
	// rate is known. Default 0.
	MaxTokens int `json:"max_tokens"`
	// TargetTTFT sizes the derived token cap: a backlog that takes longer than this to prefill
	// is refused rather than queued. Default 4s (twice the interactive TTFT SLO). Negative
	// ("-1s"): no derived cap, FallbackTokens always.
	TargetTTFT Duration `json:"target_ttft"`
	// PrefillTargetTTFT sizes the derived token cap of the (model, prefill) pool, the split
	// requests waiting for a prefill node: PrefillTargetTTFT × the prefill pool's measured
	// rate. Default 4s, as TargetTTFT; a prefill pool runs nothing else, so its backlog is
	// judged on its own. Negative ("-1s"): FallbackTokens always.
	PrefillTargetTTFT Duration `json:"prefill_target_ttft,advanced"`
	// FallbackTokens is the token cap before any prefill rate is measured. Default 65536
	// (about 4 s of one mid-size GPU's prefill).
	FallbackTokens int `json:"fallback_tokens,advanced"`
	// MaxTotal bounds all pools together. Default 16384 (memory safety).
	MaxTotal int `json:"max_total,advanced"`
	// TTL is how long a request may wait for its first token, here and (the node enforces it)
	// in an engine's queue; X-Kvmesh-Queue-TTL may only shorten it. Default 60s, under common
	// client timeouts.
	TTL Duration `json:"ttl"`
	// ShedFraction: a sheddable (negative priority) request may queue only while its pool is
	// under this fraction of both caps, at most 1. Default 0.5: batch work never fills the
	// room. Negative (-1): sheddable requests never queue.
	ShedFraction float64 `json:"shed_fraction"`
	// MinChargeTokens is the least one dispatch is charged in the fairness accounting, so
	// requests with tiny prompts still take turns. Default 16 (one KV block).
	MinChargeTokens int `json:"min_charge_tokens,advanced"`
	// Backfill is how many waiters behind a pool's head, when the head must wait for KV room,
	// the room offers to run beside it on room the head does not wait for (WaitingRoom.Next).
	// Default 8: enough to find the small requests behind a long prompt, few enough that a
	// blocked pool costs a handful of routing decisions a pass. Negative (-1): strictly head of
	// line.
	Backfill int `json:"backfill"`
	// DispatchSlack is the share of a queued request's TTFT target that must be left to spare
	// when the room dispatches it: the room hands out the earliest deadlines first, so under
	// overload every request it dispatches has nearly used its target up waiting, and the
	// TTFT estimate's error would make most of them late. Default 0.2 (a fifth); below 1.
	// Negative (-1): no slack, a request is dispatched while its predicted TTFT fits at all.
	DispatchSlack float64 `json:"dispatch_slack,advanced"`
	// DrainWindow is the window over which the dispatch rate is measured for Retry-After.
	// Default 10s: long enough to average bursts, short enough to follow load changes.
	DrainWindow Duration `json:"drain_window,advanced"`
	// MinRetryAfter and MaxRetryAfter clamp Retry-After. Defaults 1s and 60s; both positive.
	MinRetryAfter Duration `json:"min_retry_after,advanced"`
	MaxRetryAfter Duration `json:"max_retry_after,advanced"`
}

// ClassSLO is a priority class's default SLO. A zero field takes the class's default; a check
// cannot be turned off (except the low class's TPOT, which is off by default), but a target of
// an hour ("1h") never binds.
type ClassSLO struct {
	TTFT Duration `json:"ttft"`
	TPOT Duration `json:"tpot"`
}

// SLOConfig holds the class defaults used when a request names no SLO header.
type SLOConfig struct {
	// High (priority > 0): 1s TTFT, 100ms TPOT: protected interactive traffic.
	High ClassSLO `json:"high"`
	// Normal (priority 0): 2s TTFT, 200ms TPOT: interactive chat.
	Normal ClassSLO `json:"normal"`
	// Low (priority < 0, sheddable): 30s TTFT, no TPOT check: batch and evaluation jobs.
	Low ClassSLO `json:"low"`
}

// Config configures an Admitter. It loads from JSON (LoadConfig, DecodeConfig); durations are
// strings like "60s" or numbers of seconds.
//
// The zero rule, as in every kvmesh config: a zero field means its default (DefaultConfig's
// value), which New fills in; a setting that can be turned off is turned off by an explicit
// value, the negative one its documentation names, never by zero. In a file, DecodeConfig
// refuses a 0 for the settings it names, rather than read it as the default.
type Config struct {
	// Models the mesh serves, by name. ModelInfo, if set, takes precedence: the node wires it
	// to the gossiped set. At least one of them is required.
	Models map[string]ModelConfig `json:"models"`
	// ModelInfo returns a model's context size and whether the mesh serves it.
	ModelInfo func(model string) (contextTokens int, ok bool) `json:"-"`

	Tenants    map[string]TenantConfig `json:"tenants"`
	Validation ValidationConfig        `json:"validation"`
	Budget     BudgetConfig            `json:"budget"`
	Keys       KeyConfig               `json:"keys"`
	KV         KVConfig                `json:"kv"`
	Queue      QueueConfig             `json:"queue"`
	SLO        SLOConfig               `json:"slo"`
}

// DefaultConfig returns the documented defaults (no models).
func DefaultConfig() Config {
	return Config{
		Validation: ValidationConfig{MaxN: 1, MaxStop: 4, MaxLogprobs: 20},
		Budget: BudgetConfig{
			DefaultMaxTokens:   1024,
			EstimateMinSamples: 20,
			EstimateAlpha:      0.05,
			EstimateSigmas:     2,
			EstimateMaxSeries:  4096,
		},
		KV: KVConfig{QueueOn: 0.95, QueueOff: 0.85, Sheddable: 0.75, DecodeQueueOn: 0.9, DecodeQueueOff: 0.8},
		Queue: QueueConfig{
			MaxRequests:       1024,
			TargetTTFT:        Duration(4 * time.Second),
			PrefillTargetTTFT: Duration(4 * time.Second),
			FallbackTokens:    65536,
			MaxTotal:          16384,
			TTL:               Duration(60 * time.Second),
			ShedFraction:      0.5,
			MinChargeTokens:   16,
			Backfill:          8,
			DispatchSlack:     0.2,
			DrainWindow:       Duration(10 * time.Second),
			MinRetryAfter:     Duration(time.Second),
			MaxRetryAfter:     Duration(60 * time.Second),
		},
		SLO: SLOConfig{
			High:   ClassSLO{TTFT: Duration(time.Second), TPOT: Duration(100 * time.Millisecond)},
			Normal: ClassSLO{TTFT: Duration(2 * time.Second), TPOT: Duration(200 * time.Millisecond)},
			Low:    ClassSLO{TTFT: Duration(30 * time.Second)},
		},
	}
}

// LoadConfig reads a JSON config over DefaultConfig and validates it; unknown keys are an
// error. A file must name its models (the node, which names them itself, uses DecodeConfig).
func LoadConfig(data []byte) (Config, error) {
	cfg, err := DecodeConfig(data, DefaultConfig())
	if err != nil {
		return Config{}, err
	}
	return cfg, cfg.validate()
}

// DecodeConfig reads a JSON config over base (zero fields of base filled first) without
// validating it. Unknown keys are an error naming the key. A 0 for one of the settings its
// table names is an error that says what to write instead (-1 where a negative value turns
// the setting off, else the value wanted), so such a file never silently gets the default.
func DecodeConfig(data []byte, base Config) (Config, error) {
	return DecodeConfigAt(data, base, "", nil)
}

// DecodeConfigAt is DecodeConfig for a config that sits at path in a larger file (the node's
// "admission" section): the keys its errors name start with path ("admission.queue.ttll").
// moved, when set, is told of each advanced setting the file gives outside its "advanced"
// object, where it sat before (see jsonconf.AdvancedKey), with both full paths.
func DecodeConfigAt(data []byte, base Config, path string, moved func(from, to string)) (Config, error) {
	cfg := base.WithDefaults()
	f := configFile{Config: cfg, Keys: keysFile{KeyConfig: cfg.Keys, MaxPriority: (*Priority)(cfg.Keys.MaxPriority)}}
	if err := jsonconf.DecodeWith(data, &f, jsonconf.Options{Path: path, Moved: moved}); err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	cfg, cfg.Keys = f.Config, f.Keys.KeyConfig
	cfg.Keys.MaxPriority = (*int)(f.Keys.MaxPriority)
	// base has no zero where the default is not zero, so such a zero came from data.
	d := DefaultConfig()
	for _, z := range []struct {
		key        string
		zero       bool
		def        any
		offWithNeg bool
	}{
		{"validation.max_stop", cfg.Validation.MaxStop == 0, d.Validation.MaxStop, false},
		{"validation.max_logprobs", cfg.Validation.MaxLogprobs == 0, d.Validation.MaxLogprobs, false},
		{"budget.advanced.estimate_sigmas", cfg.Budget.EstimateSigmas == 0, d.Budget.EstimateSigmas, false},
		{"queue.max_requests", cfg.Queue.MaxRequests == 0, d.Queue.MaxRequests, true},
		{"queue.target_ttft", cfg.Queue.TargetTTFT == 0, d.Queue.TargetTTFT, true},
		{"queue.advanced.prefill_target_ttft", cfg.Queue.PrefillTargetTTFT == 0, d.Queue.PrefillTargetTTFT, true},
		{"queue.shed_fraction", cfg.Queue.ShedFraction == 0, d.Queue.ShedFraction, true},
		{"queue.backfill", cfg.Queue.Backfill == 0, d.Queue.Backfill, true},
		{"queue.advanced.min_retry_after", cfg.Queue.MinRetryAfter == 0, d.Queue.MinRetryAfter, false},
		{"slo.high.ttft", cfg.SLO.High.TTFT == 0, d.SLO.High.TTFT, false},
		{"slo.high.tpot", cfg.SLO.High.TPOT == 0, d.SLO.High.TPOT, false},
		{"slo.normal.ttft", cfg.SLO.Normal.TTFT == 0, d.SLO.Normal.TTFT, false},
		{"slo.normal.tpot", cfg.SLO.Normal.TPOT == 0, d.SLO.Normal.TPOT, false},
		{"slo.low.ttft", cfg.SLO.Low.TTFT == 0, d.SLO.Low.TTFT, false},
	} {
		if !z.zero {
			continue
		}
		def, _ := json.Marshal(z.def)
		if path != "" {
			z.key = path + "." + z.key
		}
		if z.offWithNeg {
			return Config{}, fmt.Errorf("%w: %s: 0 is refused, as it once turned the setting off: write -1 to turn it off, or leave the key out for the default (%s)", ErrConfig, z.key, def)
		}
		return Config{}, fmt.Errorf("%w: %s: 0 is refused, as it once turned the setting off, which nothing does now: write the value you want, or leave the key out for the default (%s)", ErrConfig, z.key, def)
	}
	return cfg, nil
}

// configFile is Config as a file writes it: keys.max_priority a Priority, which takes a name
// ("high"), where Config keeps the *int its callers (--max-priority) set.
type configFile struct {
	Config
	Keys keysFile `json:"keys"`
}

type keysFile struct {
	KeyConfig
	MaxPriority *Priority `json:"max_priority"`
}

// WithDefaults returns c with every zero field set to its default, unvalidated.
func (c Config) WithDefaults() Config {
	c.fill()
	return c
}

// fill sets every zero field to its DefaultConfig value (the zero rule). The fields whose
// default is zero (budget.max_max_tokens, keys, queue.max_tokens, slo.low.tpot) need nothing.
func (c *Config) fill() {
	d := DefaultConfig()
	setI := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	setF := func(v *float64, def float64) {
		if *v == 0 {
			*v = def
		}
	}
	setD := func(v *Duration, def Duration) {
		if *v == 0 {
			*v = def
		}
	}
	setI(&c.Validation.MaxN, d.Validation.MaxN)
	setI(&c.Validation.MaxStop, d.Validation.MaxStop)
	setI(&c.Validation.MaxLogprobs, d.Validation.MaxLogprobs)
	setI(&c.Budget.DefaultMaxTokens, d.Budget.DefaultMaxTokens)
	setI(&c.Budget.EstimateMinSamples, d.Budget.EstimateMinSamples)
	setF(&c.Budget.EstimateAlpha, d.Budget.EstimateAlpha)
	setF(&c.Budget.EstimateSigmas, d.Budget.EstimateSigmas)
	setI(&c.Budget.EstimateMaxSeries, d.Budget.EstimateMaxSeries)
	setF(&c.KV.QueueOn, d.KV.QueueOn)
	setF(&c.KV.QueueOff, d.KV.QueueOff)
	setF(&c.KV.Sheddable, d.KV.Sheddable)
	setF(&c.KV.DecodeQueueOn, d.KV.DecodeQueueOn)
	setF(&c.KV.DecodeQueueOff, d.KV.DecodeQueueOff)
	q, dq := &c.Queue, d.Queue
	setI(&q.MaxRequests, dq.MaxRequests)
	setD(&q.TargetTTFT, dq.TargetTTFT)
	setD(&q.PrefillTargetTTFT, dq.PrefillTargetTTFT)
	setI(&q.FallbackTokens, dq.FallbackTokens)
	setI(&q.MaxTotal, dq.MaxTotal)
	setD(&q.TTL, dq.TTL)
	setF(&q.ShedFraction, dq.ShedFraction)
	setI(&q.MinChargeTokens, dq.MinChargeTokens)
	setI(&q.Backfill, dq.Backfill)
	setF(&q.DispatchSlack, dq.DispatchSlack)
	setD(&q.DrainWindow, dq.DrainWindow)
	setD(&q.MinRetryAfter, dq.MinRetryAfter)
	setD(&q.MaxRetryAfter, dq.MaxRetryAfter)
	for _, s := range []struct{ c, d *ClassSLO }{{&c.SLO.High, &d.SLO.High}, {&c.SLO.Normal, &d.SLO.Normal}, {&c.SLO.Low, &d.SLO.Low}} {
		setD(&s.c.TTFT, s.d.TTFT)
		setD(&s.c.TPOT, s.d.TPOT)
	}
}

// validate fills the zero fields with their defaults, then checks the result.
func (c *Config) validate() error {
	c.fill()
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...)
	}
	if c.ModelInfo == nil && len(c.Models) == 0 {
		return bad("no models and no ModelInfo")
	}
	for name, m := range c.Models {
		if m.ContextTokens < 1 || m.BlockTokens < 0 || m.DefaultMaxTokens < 0 || m.MaxMaxTokens < 0 {
			return bad("model %q: bad sizes", name)
		}
	}
	for name, t := range c.Tenants {
		if t.DefaultMaxTokens < 0 || t.MaxMaxTokens < 0 {
			return bad("tenant %q: negative max_tokens", name)
		}
	}
	v := c.Validation
	if v.MaxN < 1 || v.MaxStop < 1 || v.MaxLogprobs < 1 {
		return bad("validation: max_n, max_stop and max_logprobs must be positive")
	}
	b := c.Budget
	if b.DefaultMaxTokens < 1 || b.MaxMaxTokens < 0 || b.EstimateMinSamples < 1 ||
		!(b.EstimateAlpha > 0 && b.EstimateAlpha <= 1) || !(b.EstimateSigmas > 0) || math.IsInf(b.EstimateSigmas, 0) || b.EstimateMaxSeries < 1 {
		return bad("budget")
	}
	if !(c.Keys.RateTokens >= 0) || c.Keys.BurstTokens < 0 {
		return bad("keys: negative rate or burst")
	}
	if p := c.Keys.MaxPriority; p != nil && (*p < -maxPriorityValue || *p > maxPriorityValue) {
		return bad("keys: max_priority %d outside ±%d", *p, maxPriorityValue)
	}
	if !(c.KV.QueueOff > 0 && c.KV.QueueOff <= c.KV.QueueOn && c.KV.QueueOn <= 1) || !(c.KV.Sheddable > 0 && c.KV.Sheddable <= 1) {
		return bad("kv: want 0 < queue_off ≤ queue_on ≤ 1 and 0 < sheddable ≤ 1")
	}
	if !(c.KV.DecodeQueueOff > 0 && c.KV.DecodeQueueOff <= c.KV.DecodeQueueOn && c.KV.DecodeQueueOn <= 1) {
		return bad("kv: want 0 < decode_queue_off ≤ decode_queue_on ≤ 1")
	}
	q := c.Queue
	if q.MaxTokens < 0 || q.FallbackTokens < 1 || q.MaxTotal < 1 ||
		q.TTL <= 0 || !(q.ShedFraction <= 1) || q.MinChargeTokens < 1 ||
		q.DrainWindow < Duration(time.Second) || q.MinRetryAfter <= 0 || q.MaxRetryAfter < q.MinRetryAfter {
		return bad("queue")
	}
	if !(q.DispatchSlack < 1) {
		return bad("queue: dispatch_slack %v must be below 1", q.DispatchSlack)
	}
	for _, s := range []ClassSLO{c.SLO.High, c.SLO.Normal, c.SLO.Low} {
		if s.TTFT < 0 || s.TPOT < 0 {
			return bad("slo: negative")
		}
	}
	return nil
}
