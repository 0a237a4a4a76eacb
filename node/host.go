package node

import (
	"context"
	"net/http"
	"time"

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
			Policy: n.cfg.Policy, Agents: n.agents != nil},
		Log: n.log, Metrics: n.m, Admitter: n.adm, Planner: n.planner, Retries: n.retries, Eject: n.eject,
		Gossip: n.g, Transport: n.tr, Spans: &n.spans, Host: journeyHost{n},
	})
}

// journeyHost is the node as its executor's journey.Host.
type journeyHost struct{ n *Node }

var _ journey.Host = journeyHost{}

func (h journeyHost) Prepare(ep engine.Endpoint, id string, body []byte) (*journey.Request, *openai.Error) {
	return h.n.prepare(ep, id, body)
}

func (h journeyHost) BuildView(v *meshview.View, model, parent string, blocks []uint64, agent string, r meshview.Rank) {
	h.n.buildView(v, model, parent, blocks, agent, r)
}

func (h journeyHost) LocalModel(model string) (engine.Model, bool) { return h.n.localModel(model) }

func (h journeyHost) Wait(ctx context.Context, p *journey.Request, t *journey.Ticket) bool {
	return h.n.wait(ctx, p, t).gone
}

func (h journeyHost) KickRoom()                                        { h.n.kickRoom() }
func (h journeyHost) Explained(p *journey.Request, t *journey.Ticket)  { h.n.explained(p, t) }
func (h journeyHost) ForwardSent(peer string)                          { h.n.forwardSent(peer) }
func (h journeyHost) LearnTokens(p *journey.Request, u *engine.Usage)  { h.n.learnTokens(p, u) }
func (h journeyHost) ObserveAgent(p *journey.Request, u *engine.Usage) { h.n.observeAgent(p, u) }
func (h journeyHost) GiveUpAgent(p *journey.Request)                   { h.n.giveUpAgent(p) }

func (h journeyHost) Generate(ctx context.Context, p *journey.Request) (engine.Stream, error) {
	return h.n.generate(ctx, p)
}

func (h journeyHost) AgentStep(ctx context.Context, w http.ResponseWriter, p *journey.Request, start time.Time, origin string) (journey.Outcome, bool) {
	return h.n.agentStep(ctx, w, p, start, origin)
}

func (h journeyHost) AgentRefused(p *journey.Request, peer, addr string, res *journey.Result) bool {
	return h.n.agentRefused(p, peer, addr, res)
}

func (h journeyHost) AwaitAgent(ctx context.Context, w http.ResponseWriter, p *journey.Request, t *journey.Ticket) (journey.Outcome, bool) {
	return h.n.awaitAgent(ctx, w, p, t)
}
