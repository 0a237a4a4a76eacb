package adapters

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/engine/sim"
	"github.com/kvmesh/kvmesh/node/journey"
	"github.com/kvmesh/kvmesh/node/lora"
	"github.com/kvmesh/kvmesh/node/meshview"
	"github.com/kvmesh/kvmesh/node/metrics"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/tracing"
)

// Codes of a load's failure, the client's answer.
const (
	// CodeAdapterLoadFailed (502): the engine refused or failed the load; the answer is final
	// (every node loads from the same source, so another would fail alike).
	CodeAdapterLoadFailed = journey.CodeAdapterLoadFailed
	// CodeAdapterLoadTimeout (504): the load, or the wait for it, outlasted
	// adapter_load_timeout; the next candidate runs the request.
	CodeAdapterLoadTimeout = "adapter_load_timeout"
	// CodeAdapterSlotsBusy (503): every adapter slot holds an adapter a request is using; the
	// next candidate runs the request.
	CodeAdapterSlotsBusy = "adapter_slots_busy"
)

// Config is the node's settings of adapters loaded on demand.
type Config struct {
	Name        string        // this node's name, in a load's error
	Source      string        // the adapter source's file ("": none, nothing loads on demand)
	LoadTimeout time.Duration // adapter_load_timeout
	MaxLoaded   int           // adapter_max_loaded (0: the engine's adapter slots)
}

// Deps are a Set's dependencies.
type Deps struct {
	Config  Config
	Engine  engine.Engine
	Runtime lora.Runtime // the external engine's runtime adapter API; nil with Sim
	Sim     *sim.Sim     // the embedded engine, when it is the engine
	Metrics *metrics.Adapters
	Spans   *tracing.Spans // a load's span; nil: none
	Log     *slog.Logger   // nil: discard
	// Served returns a model as this node's engine or some peer's record lists it.
	Served func(model string) (engine.Model, bool)
}

// Set is a node's LoRA adapters of the adapter source: nothing until Start reads the source.
// Start runs before the node serves; after it, a Set is safe for concurrent use.
type Set struct {
	cfg    Config
	eng    engine.Engine
	rt     lora.Runtime
	sim    *sim.Sim
	m      *metrics.Adapters
	log    *slog.Logger
	served func(model string) (engine.Model, bool)
	spans  *tracing.Spans
	api    string       // the engine's runtime load API, in a load's span
	loader *lora.Loader // nil without a source
}

// New returns the Set of d. It does no I/O.
func New(d Deps) *Set {
	log := d.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Set{cfg: d.Config, eng: d.Engine, rt: d.Runtime, sim: d.Sim, m: d.Metrics, log: log, served: d.Served, spans: d.Spans}
}

// apiEmbedded names the embedded engine's load API in a load's span.
const apiEmbedded = "embedded"

// simRuntime is the embedded engine's runtime adapter API.
type simRuntime struct{ s *sim.Sim }

func (r simRuntime) LoadAdapter(ctx context.Context, name, path string) error {
	if err := r.s.LoadAdapter(ctx, name, path); err != nil && !errors.Is(err, sim.ErrAdapterExists) {
		return err
	}
	return nil
}

func (r simRuntime) UnloadAdapter(_ context.Context, name string) error {
	if err := r.s.UnloadAdapter(name); err != nil && !errors.Is(err, sim.ErrAdapterNotFound) {
		return err
	}
	return nil
}

// Start reads the adapter source, if one is set, and builds the loader.
func (set *Set) Start() error {
	if set.cfg.Source == "" {
		return nil
	}
	src, err := lora.ReadSource(set.cfg.Source)
	if err != nil {
		return fmt.Errorf("adapters: adapter_source: %w", err)
	}
	rt := set.rt
	if set.sim != nil {
		rt, set.api = simRuntime{set.sim}, apiEmbedded
	} else if a, ok := rt.(interface{ AdapterAPI() string }); ok {
		set.api = a.AdapterAPI()
	}
	l, err := lora.New(lora.Config{
		Source: src, Runtime: rt, Listed: set.listed, Capacity: set.capacity, Timeout: set.cfg.LoadTimeout,
		OnLoad: func(name, outcome string, took time.Duration) {
			set.m.Loads.WithLabelValues(outcome).Inc()
			if outcome == lora.OutcomeLoaded {
				set.m.Latency.Observe(took.Seconds())
				set.log.Info("LoRA adapter loaded on demand", "adapter", name, "took", took)
				return
			}
			set.log.Warn("LoRA adapter load failed", "adapter", name, "outcome", outcome, "took", took)
		},
		OnEvict: func(name string) {
			set.m.Evictions.Inc()
			set.log.Info("LoRA adapter unloaded to make room", "adapter", name)
		},
	})
	if err != nil {
		return fmt.Errorf("adapters: %w", err)
	}
	set.loader = l
	set.log.Info("LoRA adapter source read", "source", set.cfg.Source, "adapters", len(src))
	return nil
}

// Reload reads the adapter source again and hands it to the loader (a reload of the node's
// settings): a new entry is valid, and loads, at its next request; an adapter loaded from an
// entry the source no longer lists stays until it is evicted. A source that cannot be read
// leaves the previous one in force. Nothing without a source.
func (set *Set) Reload() error {
	if set.loader == nil {
		return nil
	}
	src, err := lora.ReadSource(set.cfg.Source)
	if err != nil {
		return fmt.Errorf("adapters: adapter_source: %w", err)
	}
	set.loader.SetSource(src)
	set.log.Info("LoRA adapter source read again", "source", set.cfg.Source, "adapters", len(src))
	return nil
}

// listed are the adapters the engine lists now.
func (set *Set) listed() []string {
	var out []string
	for _, m := range set.eng.Models() {
		if m.Parent != "" {
			out = append(out, m.Name)
		}
	}
	return out
}

// capacity is how many adapters the engine may hold: adapter_max_loaded, else its
// adapter slots (0, unknown: no bound).
func (set *Set) capacity() int {
	if set.cfg.MaxLoaded > 0 {
		return set.cfg.MaxLoaded
	}
	return set.eng.State().LoRA.MaxLoRAs
}

// Source returns model as an adapter of the source whose base model is among models
// (the engine's): its base model (the entry's, else the first base model) and its context.
func (set *Set) Source(models []engine.Model, model string) (engine.Model, bool) {
	if set.loader == nil {
		return engine.Model{}, false
	}
	e, ok := set.loader.Entry(model)
	if !ok {
		return engine.Model{}, false
	}
	for _, m := range models {
		if m.Name == model {
			return engine.Model{}, false // a base model of that name wins
		}
	}
	for _, m := range models {
		if m.Parent == "" && (e.Base == "" || e.Base == m.Name) {
			return engine.Model{Name: model, ContextTokens: m.ContextTokens, Parent: m.Name, Root: e.Path}, true
		}
	}
	return engine.Model{}, false
}

// MeshSource is sourceAdapter for an ingress: the adapter is valid where its base
// model is served, here or, for an entry that names its base, on a peer.
func (set *Set) MeshSource(model string) (engine.Model, bool) {
	if a, ok := set.Source(set.eng.Models(), model); ok || set.loader == nil {
		return a, ok
	}
	e, ok := set.loader.Entry(model)
	if !ok || e.Base == "" {
		return engine.Model{}, false
	}
	base, ok := set.served(e.Base)
	if !ok {
		return engine.Model{}, false
	}
	return engine.Model{Name: model, ContextTokens: base.ContextTokens, Parent: e.Base, Root: e.Path}, true
}

// InSource reports whether model is an adapter of the adapter source.
func (set *Set) InSource(model string) bool {
	if set.loader == nil {
		return false
	}
	_, ok := set.loader.Entry(model)
	return ok
}

// WithSource makes model, an adapter of the source on base, a model of every peer of v
// serving base: one that does not list it must load it first, which its AdapterLoad counts
// (this node's exactly, a peer's as this node's estimate).
func (set *Set) WithSource(v *meshview.View, model, base string) {
	for i := range v.Peers {
		p := &v.Peers[i]
		if slices.Contains(p.Models, model) || !slices.Contains(p.Models, base) {
			continue
		}
		p.Models = append(p.Models, model)
		p.AdapterLoad = set.loader.Estimate()
		if p.Self {
			p.AdapterLoad = set.loader.Expected(model)
		}
	}
}

// Load is the load time a request for model counts on this node.
func (set *Set) Load(model string) time.Duration {
	if set.loader == nil {
		return 0
	}
	return set.loader.Expected(model)
}

// Acquire loads model if it is an adapter of the source the engine does not hold, and
// holds it until release.
func (set *Set) Acquire(ctx context.Context, model string) (release func(), err error) {
	if set.loader == nil {
		return func() {}, nil
	}
	tctx, lt := set.startTrace(ctx, model)
	release, err = set.loader.Acquire(tctx, model)
	set.endTrace(ctx, lt, err)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &adapterError{err: err, node: set.cfg.Name}
	}
	return release, nil
}

// adapterError is a load's failure as the client's answer (journey.EngineError reads
// APIError).
type adapterError struct {
	err  error
	node string
}

func (e *adapterError) Error() string { return e.err.Error() }
func (e *adapterError) Unwrap() error { return e.err }

func (e *adapterError) APIError() *openai.Error {
	var le *lora.Error
	name := ""
	if errors.As(e.err, &le) {
		name = le.Adapter
	}
	switch {
	case errors.Is(e.err, lora.ErrNoIdleSlot):
		return openai.NewError(http.StatusServiceUnavailable, CodeAdapterSlotsBusy,
			fmt.Sprintf("LoRA adapter %q cannot be loaded on node %s now: every adapter slot holds an adapter in use", name, e.node))
	case errors.Is(e.err, lora.ErrNotInSource):
		// As an owner answers a request for an adapter of no source: the engine does not
		// hold it, and nothing can load it.
		return openai.NewError(http.StatusNotFound, openai.CodeModelNotFound,
			fmt.Sprintf("this node does not serve %s: node %s's adapter source no longer lists the LoRA adapter (a reload dropped it while the request waited for its load)", name, e.node))
	case errors.Is(e.err, lora.ErrLoadTimeout):
		return openai.NewError(http.StatusGatewayTimeout, CodeAdapterLoadTimeout,
			fmt.Sprintf("LoRA adapter %q was not loaded on node %s in time: %v", name, e.node, le.Cause))
	}
	msg := fmt.Sprintf("LoRA adapter %q could not be loaded on node %s", name, e.node)
	if le != nil && le.Cause != nil {
		msg += ": " + le.Cause.Error()
	}
	return openai.NewError(http.StatusBadGateway, CodeAdapterLoadFailed, msg)
}

// WithLoaded is models with the adapters the loader loaded that the engine does not list
// yet (an external engine's list is read every models_interval): each loaded one is in the
// next record, resident.
func (set *Set) WithLoaded(models []engine.Model) []engine.Model {
	if set.loader == nil {
		return models
	}
	for _, name := range set.loader.Loaded() {
		if a, ok := set.Source(models, name); ok {
			models = append(models, a)
		}
	}
	return models
}

// Loaded are the adapters the loader loaded and the engine holds.
func (set *Set) Loaded() []string {
	if set.loader == nil {
		return nil
	}
	return set.loader.Loaded()
}
