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
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node/agentgate"
	"github.com/kvmesh/kvmesh/node/console"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/meshview"
	"github.com/kvmesh/kvmesh/node/metrics"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/tracing"
	"github.com/kvmesh/kvmesh/node/transport"
)

// Host is what an Executor asks of the node it runs in: the node's own parts of a journey
// (decoding a request, its view of the mesh and of itself, whether it drains). A node
// implements it with an unexported adapter.
type Host interface {
	// Prepare decodes body, a request for endpoint ep with id, as the ingress does.
	Prepare(ep engine.Endpoint, id string, body []byte) (*Request, *openai.Error)
	// BuildView fills v for a decision on a request for model (of parent, an adapter's base
	// model) whose prompt hashes to blocks, of agent, ranked r against KV claims.
	BuildView(v *meshview.View, model, parent string, blocks []uint64, agent string, r meshview.Rank)
	// LocalModel reports whether this node's engine serves model now.
	LocalModel(model string) (engine.Model, bool)
	// Draining reports whether the node is shutting down: it takes no new work.
	Draining() bool
	// ServesMessages reports whether this node's engine serves the Anthropic Messages API
	// natively (an external engine's, asked once at its start): a Messages request runs on it
	// as the client sent it (native.go).
	ServesMessages() bool
	// SelfPeer is this node as routing sees it, from its engine's exact state, holding the
	// longest prefix of blocks its own index lists.
	SelfPeer(blocks []uint64) route.Peer
	// ClaimedHere is the KV room claimed on this node for requests that outrank r, a
	// request ingress forwarded.
	ClaimedHere(r meshview.Rank, ingress string) int
}

// Config is the node's settings an Executor reads.
type Config struct {
	Name            string        // this node's name, in X-Kvmesh-Node
	DrainTimeout    time.Duration // in the error of a request the drain timeout ends
	ForwardAttempts int           // the candidates one dispatch tries at most
	Migrations      int           // the moves of one request mid-response (negative: migration off)
	SpeculativeTTL  time.Duration // how long a forwarded prefix counts as the owner's before its summary
	RetryAfter      time.Duration // a refusal's Retry-After
	Policy          string        // the routing policy (delegation is the kvmesh policy's)
	Standalone      bool          // the node is kvmesh engine: its engine alone, no agent window
	AgentInterval   time.Duration // the agent window's control interval
	Role            string        // this node's role (route.Role*)
	Embedded        bool          // this node's engine is the embedded one
	RoomTick        time.Duration // how often the waiting room loop passes without a kick
	LearnTokens     bool          // the engine teaches bytes per token (an external engine)
}

// Adapters load a request's LoRA adapter before its generation.
type Adapters interface {
	// Acquire loads model if it is an adapter the engine must load, and holds it until
	// release.
	Acquire(ctx context.Context, model string) (release func(), err error)
	// Load is how long loading model's LoRA adapter would take here (0: none to load), which
	// admission counts in the predicted TTFT.
	Load(model string) time.Duration
}

// Deps are an Executor's dependencies, set once before the node serves. Gossip and
// Transport are nil on a standalone node.
type Deps struct {
	Config    Config
	Engine    engine.Engine // this node's engine
	Log       *slog.Logger  // nil: discard
	Metrics   *metrics.Metrics
	Admitter  *admit.Admitter
	Planner   *plan.Planner
	Retries   *route.RetryBudget
	Eject     *route.Ejector
	Gossip    *gossip.Gossip
	Transport *transport.Transport
	Agents    *agentgate.Gate // nil: agent admission off
	Adapters  Adapters
	Console   *console.Console // nil: no console
	Tokens    *meshview.Tokens // a prompt's tokens by model, which a finished run teaches
	// Spans are the node's, read at each request: the node may replace them before it serves.
	Spans *tracing.Spans
	Host  Host
}

// Executor performs a request's steps (node/attempt's): runs it on this node's engine,
// forwards it to peers, splits it over a prefill and a decode node, migrates a broken stream,
// hands a request for a model this node does not serve to a delegate, and keeps the retry
// budget's and the owners' refusals' books. Safe for concurrent use.
type Executor struct {
	cfg      Config
	eng      engine.Engine
	log      *slog.Logger
	m        *metrics.Metrics
	adm      *admit.Admitter
	planner  *plan.Planner
	retries  *route.RetryBudget
	eject    *route.Ejector
	g        *gossip.Gossip
	tr       *transport.Transport
	agents   *agentgate.Gate
	adapters Adapters
	console  *console.Console
	tokens   *meshview.Tokens
	spans    *tracing.Spans
	host     Host
	roomKick chan struct{} // a pass of the room loop, now
	// inFlightTokens are the output tokens this node's engine may still produce for the
	// requests it runs: their caps, from their first token to their end.
	inFlightTokens atomic.Int64
}

// New returns the executor of d. It does no I/O and starts no goroutine.
func New(d Deps) (*Executor, error) {
	if d.Engine == nil || d.Adapters == nil || d.Metrics == nil || d.Admitter == nil || d.Planner == nil ||
		d.Retries == nil || d.Eject == nil || d.Tokens == nil || d.Spans == nil || d.Host == nil {
		return nil, errors.New("journey: an executor needs an engine, adapters, metrics, an admitter, a planner, a retry budget, an ejector, token counts, spans and a host")
	}
	log := d.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Executor{cfg: d.Config, eng: d.Engine, log: log, m: d.Metrics, adm: d.Admitter, planner: d.Planner, retries: d.Retries,
		eject: d.Eject, roomKick: make(chan struct{}, 1), g: d.Gossip, tr: d.Transport, agents: d.Agents, adapters: d.Adapters, console: d.Console, tokens: d.Tokens, spans: d.Spans, host: d.Host}, nil
}

// InFlightTokens are the output tokens this node's engine may still produce for the requests
// it runs now (their caps), as published in the node's record.
func (x *Executor) InFlightTokens() int64 { return x.inFlightTokens.Load() }

// DrainCut is the error of a request the drain timeout ended, when ctx (its context) says it
// did; nil otherwise (the client left, or nothing ended it).
func (x *Executor) DrainCut(ctx context.Context) *openai.Error {
	return DrainCut(ctx, x.cfg.Name, x.cfg.DrainTimeout)
}

// BlockTokens is eng's KV block size, kvindex's default until it reports one.
func BlockTokens(eng engine.Engine) int {
	if st := eng.State(); st.BlockTokens > 0 {
		return st.BlockTokens
	}
	return kvindex.DefaultBlockTokens
}
