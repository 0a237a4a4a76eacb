package api

import (
	"errors"
	"log/slog"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/plan"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/node/console"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/engine/external"
	"github.com/kvmesh/kvmesh/node/engine/kvevents"
	"github.com/kvmesh/kvmesh/node/engine/sim"
	"github.com/kvmesh/kvmesh/node/journey"
	"github.com/kvmesh/kvmesh/node/kvconnector"
	"github.com/kvmesh/kvmesh/node/meshview"
	"github.com/kvmesh/kvmesh/node/metrics"
	"github.com/kvmesh/kvmesh/node/tracing"
	"github.com/kvmesh/kvmesh/node/transport"
)

// Host is what the API asks of the node it serves: the node's view of the models and of
// itself, its token counts and its address.
type Host interface {
	// LocalModel reports whether this node's engine serves model now.
	LocalModel(model string) (engine.Model, bool)
	// MeshModel returns model as some node of the mesh serves it (an adapter with its parent).
	MeshModel(model string) (engine.Model, bool)
	// MeshModelInfo is MeshModel's context size.
	MeshModelInfo(model string) (int, bool)
	// LocalState is this node's state record.
	LocalState() gossip.State
	// SelfPeer is this node as routing sees it, holding its longest cached prefix of blocks.
	SelfPeer(blocks []uint64) route.Peer
	// MeshModels lists the models served anywhere in the mesh this node sees.
	MeshModels() []engine.Model
	// Unready reports whether the node is shutting down (/readyz 503).
	Unready() bool
	// JoinFailing says why the node serves alone while it cannot join its seeds, or "".
	JoinFailing() string
	// HTTPAddr is the bound API address, where a standalone engine's prefill is pulled from
	// when the request's Host names no port.
	HTTPAddr() string
}

// Config is the node's settings the API reads.
type Config struct {
	Name            string        // this node's name
	Standalone      bool          // the node is kvmesh engine: no mesh, its engine alone
	MaxBodyBytes    int64         // a request body's limit (413 past it)
	BodyTimeout     time.Duration // how long reading a body may take (408 past it)
	MaxAgentIDBytes int           // X-Kvmesh-Agent's limit
	AgentFromUser   bool          // a request without X-Kvmesh-Agent is its body's user's agent
	ForwardAttempts int           // the candidates a simple request tries at most
	SimRole         string        // the embedded engine's role in kvmesh engine's KV connector flow
}

// Deps are a Server's dependencies, set once before the node serves. Gossip and Transport
// are nil on a standalone node, External without an external engine.
type Deps struct {
	Config    Config
	Log       *slog.Logger // nil: discard
	Metrics   *metrics.Metrics
	Admitter  *admit.Admitter
	Planner   *plan.Planner
	Engine    engine.Engine
	External  *external.Engine
	Gossip    *gossip.Gossip
	Transport *transport.Transport
	Executor  *journey.Executor
	Console   *console.Console // nil: no console
	Tokens    *meshview.Tokens // a prompt's tokens by model
	// Sim is the embedded engine, KV its store of handovers (a standalone node's) and KVPub
	// the publisher of its KV events; each nil when not in use.
	Sim   *sim.Sim
	KV    *kvconnector.Store
	KVPub *kvevents.Publisher
	// Spans are the node's, read at each request: the node may replace them before it serves.
	Spans *tracing.Spans
	Host  Host
}

// Server is the node's HTTP API: the handlers of the generation endpoints (chat,
// completions), the simple ones (embeddings, Responses), authentication and the request
// counters. The node's mux routes to them. Safe for concurrent use.
type Server struct {
	cfg     Config
	log     *slog.Logger
	m       *metrics.Metrics
	adm     *admit.Admitter
	planner *plan.Planner
	eng     engine.Engine
	ext     *external.Engine
	g       *gossip.Gossip
	tr      *transport.Transport
	x       *journey.Executor
	console *console.Console
	tokens  *meshview.Tokens
	sim     *sim.Sim
	kv      *kvconnector.Store
	kvpub   *kvevents.Publisher
	spans   *tracing.Spans
	host    Host
}

// New returns the Server of d. It does no I/O and starts no goroutine.
func New(d Deps) (*Server, error) {
	if d.Metrics == nil || d.Admitter == nil || d.Planner == nil || d.Engine == nil || d.Executor == nil ||
		d.Tokens == nil || d.Spans == nil || d.Host == nil {
		return nil, errors.New("api: a server needs metrics, an admitter, a planner, an engine, an executor, token counts, spans and a host")
	}
	log := d.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: d.Config, log: log, m: d.Metrics, adm: d.Admitter, planner: d.Planner, eng: d.Engine, ext: d.External,
		g: d.Gossip, tr: d.Transport, x: d.Executor, console: d.Console, tokens: d.Tokens, sim: d.Sim, kv: d.KV, kvpub: d.KVPub, spans: d.Spans, host: d.Host}, nil
}

// forwardSent counts a forward to peer in the console's matrix.
func (sv *Server) forwardSent(peer string) {
	if sv.console != nil {
		sv.console.ForwardSent(peer)
	}
}
