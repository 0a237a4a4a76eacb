package journey

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/plan"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/metrics"
	"github.com/kvmesh/kvmesh/node/openai"
)

// Host is what an Executor asks of the node it runs in: the parts of a run that are the
// node's (its engine's adapters, tracing, what the node learns from a finished request).
type Host interface {
	// Generate runs p on this node's engine: its adapter loaded, traced, and its wait for
	// the first token bounded by p.Due (a *firsttoken.Late past it).
	Generate(ctx context.Context, p *Request) (engine.Stream, error)
	// LearnTokens learns the model's bytes per token from p's completed run on this node's
	// engine (u: its usage); never called for a continuation, whose usage is the whole
	// request's.
	LearnTokens(p *Request, u *engine.Usage)
	// ObserveAgent takes an agent's step's usage into its window's footprint.
	ObserveAgent(p *Request, u *engine.Usage)
}

// Deps are an Executor's dependencies, set once before the node serves.
type Deps struct {
	Name         string        // this node's name, in X-Kvmesh-Node
	DrainTimeout time.Duration // in the error of a request the drain timeout ends
	Log          *slog.Logger  // nil: discard
	Metrics      *metrics.Metrics
	Admitter     *admit.Admitter
	Planner      *plan.Planner
	Retries      *route.RetryBudget
	Host         Host
}

// Executor performs a request's steps on this node: runs it on the engine, and keeps the
// retry budget's and the owners' refusals' books. Safe for concurrent use.
type Executor struct {
	cfg     Deps
	log     *slog.Logger
	m       *metrics.Metrics
	adm     *admit.Admitter
	planner *plan.Planner
	retries *route.RetryBudget
	host    Host
	// inFlightTokens are the output tokens this node's engine may still produce for the
	// requests it runs: their caps, from their first token to their end.
	inFlightTokens atomic.Int64
}

// New returns the executor of d. It does no I/O.
func New(d Deps) (*Executor, error) {
	if d.Metrics == nil || d.Admitter == nil || d.Planner == nil || d.Retries == nil || d.Host == nil {
		return nil, errors.New("journey: an executor needs metrics, an admitter, a planner, a retry budget and a host")
	}
	log := d.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Executor{cfg: d, log: log, m: d.Metrics, adm: d.Admitter, planner: d.Planner, retries: d.Retries, host: d.Host}, nil
}

// InFlightTokens are the output tokens this node's engine may still produce for the requests
// it runs now (their caps), as published in the node's record.
func (x *Executor) InFlightTokens() int64 { return x.inFlightTokens.Load() }

// DrainCut is the error of a request the drain timeout ended, when ctx (its context) says it
// did; nil otherwise (the client left, or nothing ended it).
func (x *Executor) DrainCut(ctx context.Context) *openai.Error {
	return DrainCut(ctx, x.cfg.Name, x.cfg.DrainTimeout)
}
