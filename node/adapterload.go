package node

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/engine/sim"
	"github.com/kvmesh/kvmesh/node/journey"
	"github.com/kvmesh/kvmesh/node/lora"
	"github.com/kvmesh/kvmesh/node/meshview"
	"github.com/kvmesh/kvmesh/node/openai"
)

// LoRA adapters loaded on demand (Config.AdapterSource, package node/lora): every adapter of
// the source is a model of this node while it serves the adapter's base model (localModel),
// routing counts the adapter on every peer serving that base (withSourceAdapter), and running
// a request for one (generate) first loads it through the engine's runtime API, which admission
// counts in the predicted TTFT (route.Peer.AdapterLoad).

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

// adapterMetrics are the loads' families, registered whether or not a source is set.
type adapterMetrics struct {
	loads     *prometheus.CounterVec // outcome
	latency   prometheus.Histogram
	evictions prometheus.Counter
}

func newAdapterMetrics(reg prometheus.Registerer) *adapterMetrics {
	m := &adapterMetrics{
		loads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_adapter_loads_total", Help: "LoRA adapter loads on demand through the engine's runtime API, by outcome (loaded, failed, timeout).",
		}, []string{"outcome"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kvmesh_adapter_load_seconds", Help: "Time a LoRA adapter load on demand took, the unload that made room included.",
			Buckets: []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_adapter_evictions_total", Help: "LoRA adapters unloaded, least recently used first, to make room for a load on demand.",
		}),
	}
	for _, o := range []string{lora.OutcomeLoaded, lora.OutcomeFailed, lora.OutcomeTimeout} {
		m.loads.WithLabelValues(o)
	}
	if reg != nil {
		reg.MustRegister(m.loads, m.latency, m.evictions)
	}
	return m
}

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

// startAdapters reads the adapter source, if one is set, and builds the loader.
func (n *Node) startAdapters() error {
	if n.cfg.AdapterSource == "" {
		return nil
	}
	src, err := lora.ReadSource(n.cfg.AdapterSource)
	if err != nil {
		return fmt.Errorf("node: adapter_source: %w", err)
	}
	var rt lora.Runtime = n.ext
	if n.sim != nil {
		rt = simRuntime{n.sim}
	}
	l, err := lora.New(lora.Config{
		Source: src, Runtime: rt, Listed: n.listedAdapters, Capacity: n.adapterCapacity, Timeout: n.cfg.AdapterLoadTimeout,
		OnLoad: func(name, outcome string, took time.Duration) {
			n.am.loads.WithLabelValues(outcome).Inc()
			if outcome == lora.OutcomeLoaded {
				n.am.latency.Observe(took.Seconds())
				n.log.Info("LoRA adapter loaded on demand", "adapter", name, "took", took)
				return
			}
			n.log.Warn("LoRA adapter load failed", "adapter", name, "outcome", outcome, "took", took)
		},
		OnEvict: func(name string) {
			n.am.evictions.Inc()
			n.log.Info("LoRA adapter unloaded to make room", "adapter", name)
		},
	})
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	n.loader = l
	n.log.Info("LoRA adapter source read", "source", n.cfg.AdapterSource, "adapters", len(src))
	return nil
}

// listedAdapters are the adapters the engine lists now.
func (n *Node) listedAdapters() []string {
	var out []string
	for _, m := range n.eng.Models() {
		if m.Parent != "" {
			out = append(out, m.Name)
		}
	}
	return out
}

// adapterCapacity is how many adapters the engine may hold: adapter_max_loaded, else its
// adapter slots (0, unknown: no bound).
func (n *Node) adapterCapacity() int {
	if n.cfg.AdapterMaxLoaded > 0 {
		return n.cfg.AdapterMaxLoaded
	}
	return n.eng.State().LoRA.MaxLoRAs
}

// sourceAdapter returns model as an adapter of the source whose base model is among models
// (the engine's): its base model (the entry's, else the first base model) and its context.
func (n *Node) sourceAdapter(models []engine.Model, model string) (engine.Model, bool) {
	if n.loader == nil {
		return engine.Model{}, false
	}
	e, ok := n.loader.Entry(model)
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

// meshSourceAdapter is sourceAdapter for an ingress: the adapter is valid where its base
// model is served, here or, for an entry that names its base, on a peer.
func (n *Node) meshSourceAdapter(model string) (engine.Model, bool) {
	if a, ok := n.sourceAdapter(n.eng.Models(), model); ok || n.loader == nil {
		return a, ok
	}
	e, ok := n.loader.Entry(model)
	if !ok || e.Base == "" {
		return engine.Model{}, false
	}
	base, ok := n.servedInMesh(e.Base)
	if !ok {
		return engine.Model{}, false
	}
	return engine.Model{Name: model, ContextTokens: base.ContextTokens, Parent: e.Base, Root: e.Path}, true
}

// inSource reports whether model is an adapter of the adapter source.
func (n *Node) inSource(model string) bool {
	if n.loader == nil {
		return false
	}
	_, ok := n.loader.Entry(model)
	return ok
}

// withSourceAdapter makes model, an adapter of the source on base, a model of every peer of v
// serving base: one that does not list it must load it first, which its AdapterLoad counts
// (this node's exactly, a peer's as this node's estimate).
func (n *Node) withSourceAdapter(v *meshview.View, model, base string) {
	for i := range v.Peers {
		p := &v.Peers[i]
		if slices.Contains(p.Models, model) || !slices.Contains(p.Models, base) {
			continue
		}
		p.Models = append(p.Models, model)
		p.AdapterLoad = n.loader.Estimate()
		if p.Self {
			p.AdapterLoad = n.loader.Expected(model)
		}
	}
}

// adapterLoad is the load time a request for model counts on this node.
func (n *Node) adapterLoad(model string) time.Duration {
	if n.loader == nil {
		return 0
	}
	return n.loader.Expected(model)
}

// acquireAdapter loads p's adapter if it is one of the source the engine does not hold, and
// holds it until release.
func (n *Node) acquireAdapter(ctx context.Context, p *journey.Request) (release func(), err error) {
	if n.loader == nil {
		return func() {}, nil
	}
	release, err = n.loader.Acquire(ctx, p.Req.Model)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &adapterError{err: err, node: n.cfg.Name}
	}
	return release, nil
}

// adapterError is a load's failure as the client's answer (engineError reads APIError).
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

// heldStream releases its adapter's hold when closed.
type heldStream struct {
	engine.Stream
	release func()
}

func (s *heldStream) Close() error {
	err := s.Stream.Close()
	s.release()
	return err
}

// withLoaded is models with the adapters the loader loaded that the engine does not list
// yet (an external engine's list is read every models_interval): each loaded one is in the
// next record, resident.
func (n *Node) withLoaded(models []engine.Model) []engine.Model {
	if n.loader == nil {
		return models
	}
	for _, name := range n.loader.Loaded() {
		if a, ok := n.sourceAdapter(models, name); ok {
			models = append(models, a)
		}
	}
	return models
}

// loadedAdapters are the adapters the loader loaded and the engine holds.
func (n *Node) loadedAdapters() []string {
	if n.loader == nil {
		return nil
	}
	return n.loader.Loaded()
}
