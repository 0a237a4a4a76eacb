package node

import (
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/node/api"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/journey"
	"github.com/kvmesh/kvmesh/node/meshview"
	"github.com/kvmesh/kvmesh/node/openai"
)

// newExecutor builds the executor of the request's journey on the parts New built.
func (n *Node) newExecutor() (*journey.Executor, error) {
	return journey.New(journey.Deps{
		Config: journey.Config{Name: n.cfg.Name, DrainTimeout: n.cfg.DrainTimeout, ForwardAttempts: n.cfg.ForwardAttempts,
			Migrations: n.cfg.Migrations, SpeculativeTTL: n.cfg.SpeculativeTTL, RetryAfter: n.cfg.RetryAfter,
			Policy: n.cfg.Policy, Standalone: n.cfg.Standalone, AgentInterval: n.cfg.AgentInterval,
			Role: n.cfg.Role, Embedded: n.sim != nil, RoomTick: n.cfg.RoomTick, LearnTokens: n.ext != nil},
		Engine: n.eng, Log: n.log, Metrics: n.m, Admitter: n.adm, Planner: n.planner, Retries: n.retries, Eject: n.eject,
		Gossip: n.g, Transport: n.tr, Agents: n.agents, Adapters: n.adapters, Console: n.console, Tokens: n.tokens,
		Spans: &n.spans, Host: host{n},
	})
}

// newAPI builds the HTTP API's handlers on the parts New built.
func (n *Node) newAPI() (*api.Server, error) {
	return api.New(api.Deps{
		Config: api.Config{Name: n.cfg.Name, Standalone: n.cfg.Standalone, MaxBodyBytes: n.cfg.MaxBodyBytes,
			BodyTimeout: n.cfg.BodyTimeout, MaxAgentIDBytes: n.cfg.MaxAgentIDBytes, AgentFromUser: n.cfg.AgentFromUser,
			ForwardAttempts: n.cfg.ForwardAttempts, SimRole: n.cfg.Sim.Role},
		Log: n.log, Metrics: n.m, Admitter: n.adm, Planner: n.planner, Engine: n.eng, External: n.ext,
		Sim: n.sim, KV: n.kv, KVPub: n.kvpub,
		Gossip: n.g, Transport: n.tr, Executor: n.x, Console: n.console, Tokens: n.tokens, Spans: &n.spans, Host: host{n},
	})
}

// host is the node as its executor's journey.Host and its API's api.Host.
type host struct{ n *Node }

var (
	_ journey.Host = host{}
	_ api.Host     = host{}
)

func (h host) MeshModel(model string) (engine.Model, bool) { return h.n.meshModel(model) }
func (h host) MeshModelInfo(model string) (int, bool)      { return h.n.meshModelInfo(model) }
func (h host) LocalState() gossip.State                    { return h.n.localState() }
func (h host) SelfPeer(blocks []uint64) route.Peer         { return h.n.selfPeer(blocks) }

func (h host) HTTPAddr() string           { return h.n.HTTPAddr() }
func (h host) MeshModels() []engine.Model { return h.n.meshModels() }
func (h host) Unready() bool              { return h.n.unready.Load() }
func (h host) JoinFailing() string        { return h.n.joinFailing() }

func (h host) Prepare(ep engine.Endpoint, id string, body []byte) (*journey.Request, *openai.Error) {
	return h.n.api.Prepare(ep, id, body)
}

func (h host) BuildView(v *meshview.View, model, parent string, blocks []uint64, agent string, r meshview.Rank) {
	h.n.buildView(v, model, parent, blocks, agent, r)
}

func (h host) LocalModel(model string) (engine.Model, bool) { return h.n.localModel(model) }

func (h host) ClaimedHere(r meshview.Rank, ingress string) int { return h.n.claimedHere(r, ingress) }
func (h host) Draining() bool                                  { return h.n.isDraining() }
func (h host) ServesMessages() bool                            { return h.n.servesMessages() }
