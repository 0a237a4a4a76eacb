package node

import (
	"context"
	"fmt"

	"net/http"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/agent"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/node/agentgate"
	"github.com/kvmesh/kvmesh/node/api"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/journey"
	"github.com/kvmesh/kvmesh/node/metrics"
	"github.com/kvmesh/kvmesh/node/nodeconfig"
	"github.com/kvmesh/kvmesh/node/openai"
)

// CodeAgentPaused is an owner's refusal of an agent step whose agent is outside its window
// (paused, or new and waiting for a slot). The ingress holds the step and retries it at the
// same owner; the client never sees this code unless the step's queue TTL runs out.
const CodeAgentPaused = journey.CodeAgentPaused

// DefaultAgentInterval is the agent window's control interval when Config.AgentInterval is 0.
const DefaultAgentInterval = nodeconfig.DefaultAgentInterval

// HeaderAgentFinal, set to 1 on an agent's last step, ends the agent at its home once that
// step is done, so its window slot goes to the next agent at once instead of after the idle
// timeout.
const HeaderAgentFinal = api.HeaderAgentFinal

// buildAgents sets up agent admission when cfg.Agents is set. It does no I/O.
func (n *Node) buildAgents() error {
	if n.cfg.AgentInterval <= 0 {
		n.cfg.AgentInterval = DefaultAgentInterval
	}
	if n.cfg.Agents == nil {
		return nil
	}
	reg, err := agent.New(*n.cfg.Agents)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	home, err := agent.NewHome(agent.HomeConfig{Name: n.cfg.Name, Interval: n.cfg.AgentInterval,
		LeaseIntervals: n.cfg.AgentLeaseIntervals, Key: route.AgentKey, Preferred: route.PreferredHome}, reg)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	var demote func([]uint64) int
	if n.sim != nil {
		demote = n.sim.Demote
	}
	n.agents = agentgate.New(home, demote)
	n.reg.MustRegister(metrics.NewAgentCollector(n.agents, n.cfg.Name))
	return nil
}

// agentStep is what the local serving path does with an agent step: run it (Executor.ServeLocal with
// the window's bookkeeping around it) or, when the agent is outside the window, report parked
// so the caller answers "wait". Requests without an agent, or with agent admission off, run.
func (n *Node) agentStep(ctx context.Context, w http.ResponseWriter, p *journey.Request, start time.Time, origin string) (journey.Outcome, bool) {
	g := n.agents
	if g == nil || p.Adm.Agent == "" {
		return n.x.ServeLocal(ctx, w, p, start, origin), true
	}
	id := p.Adm.Agent
	run, err := g.Arrive(time.Now(), p, id, p.Adm.PromptTokens, origin == "local")
	if !run {
		return journey.Outcome{}, false
	}
	o := n.x.ServeLocal(ctx, w, p, start, origin)
	if err != nil {
		// ErrFull: every registered agent is mid-step; the step ran unprotected rather than
		// fail, as request-level admission already accepted it.
		n.log.Debug("agent registry", "agent", id, "err", err)
	}
	// The client said this was the agent's last step (agentFinal), whatever its outcome: the
	// slot and the KV the window kept for it go to the next agent now.
	g.Ran(time.Now(), p, id, err == nil, p.AgentFinal, p.Req.Blocks)
	return o, true
}

// observeAgent records a completed step's cache outcome (called from finished, before the
// step's StepDone) for the recompute-avoided count, and its final context length.
func (n *Node) observeAgent(p *journey.Request, u *engine.Usage) {
	g := n.agents
	if g == nil || p.Adm.Agent == "" || n.cfg.Standalone {
		return // Standalone serves without the window (no agentStep to collect the context)
	}
	g.Observe(p, p.Adm.Agent, u.CachedTokens, u.PromptTokens, u.CompletionTokens)
}

// agentRefused handles a dispatch attempt the agent window of peer (at addr) turned down: the
// step must wait, at the same home, so dispatch must not try other candidates. It reports
// whether it was such a refusal.
func (n *Node) agentRefused(p *journey.Request, peer, addr string, res *journey.Result) bool {
	if n.agents == nil || p.Adm.Agent == "" || res.LastCode != CodeAgentPaused {
		return false
	}
	res.Requeue = true
	p.Parked = journey.Parking{Home: peer, Addr: addr}
	n.x.Stick(p, peer) // the window and the prefix are there: the retry must go there too
	return true
}

// awaitAgent keeps a step whose agent is outside its home's window until the agent is let in
// (this node is the home and wakes it, or a peer is and answers its renewal), the step's queue
// TTL ends, the client leaves or the node drains. It then decides again, or answers the
// client and reports done. The step waits here, not in the waiting room, so it cannot block
// the requests queued behind it there, and it asks a peer home with renewals, which keep the
// home's lease on the agent's place, rather than by sending the step again.
func (n *Node) awaitAgent(ctx context.Context, w http.ResponseWriter, p *journey.Request, t *journey.Ticket) (journey.Outcome, bool) {
	g := n.agents
	expires := n.adm.Item(p.Adm, t.D).Expires
	for {
		id, wake, here := g.Parked(p)
		in := true // the agent may be in the window, or gone from the registry: decide again
		if here {
			n.pauseAgent(ctx, wake, expires)
			in = g.MayRun(id)
		} else {
			st, err := n.renewAtHome(ctx, p, max(min(n.cfg.AgentInterval, time.Until(expires)), 0))
			if err != nil {
				// The home did not answer (unreachable, or too old to know the message): route
				// the step again after an interval, which asks with the step itself.
				n.log.Debug("agent lease", "agent", p.Adm.Agent, "home", p.Parked.Home, "err", err)
				n.pauseAgent(ctx, nil, expires)
			}
			in = err != nil || st == agent.Active || st == agent.Absent
		}
		now := time.Now()
		var giveUp *admit.Decision
		switch {
		case ctx.Err() != nil:
			return journey.Outcome{Code: openai.CodeClientClosed, Refused: true}, true
		case n.isDraining() || g.Stopped():
			d := n.drainingRefusal()
			giveUp = &d
		case !now.Before(expires):
			d := n.adm.Expired(now)
			giveUp = &d
		}
		if giveUp != nil {
			n.m.DecisionOf(*giveUp)
			journey.WriteRefusal(w, journey.RefusalOf(*giveUp), giveUp.RetryAfter)
			return journey.Outcome{Code: giveUp.Code, Refused: true}, true
		}
		if !in {
			continue
		}
		if here {
			// Routing may now send the step elsewhere, so this node stops tracking it as
			// parked; its parking (p.parked) stays until it runs or is given up.
			g.Unpark(p)
		}
		// The window wait is admission's own doing, bounded by the queue TTL: the step's TTFT
		// SLO counts from here, so the checks ahead do not refuse it for time spent parked.
		p.Adm.SLOStart = now
		n.x.Decide(now, p, t, nil, nil)
		n.m.DecisionOf(t.D)
		return journey.Outcome{}, false
	}
}

// pauseAgent waits until wake closes (nil: never), an interval passes, expires comes, ctx
// ends or the agent control loop stops.
func (n *Node) pauseAgent(ctx context.Context, wake <-chan struct{}, expires time.Time) {
	n.agents.Pause(ctx, wake, min(n.cfg.AgentInterval, time.Until(expires)))
}

// runAgents is the window's control loop: an agentTick every AgentInterval.
func (n *Node) runAgents(ctx context.Context) {
	defer n.agents.Stop()
	ticking(ctx, n.cfg.AgentInterval, func() { n.agentTick(time.Now()) })
}

// agentTick is one control interval of the window, fed the engine's state and the agents
// peers are home to.
func (n *Node) agentTick(now time.Time) {
	st := n.eng.State()
	n.agents.Tick(now, agent.Engine{KVBlocksTotal: st.KVBlocksTotal, KVBlocksUsed: st.KVBlocksUsed,
		BlockTokens: st.BlockTokens}, n.agentsAdvertised())
}

// agentsAdvertised returns, by route.AgentKey, the healthy peers that advertise being home to
// an agent (gossip State.AgentKeys), or nil when none does.
func (n *Node) agentsAdvertised() map[uint64][]string {
	if n.g == nil {
		return nil
	}
	var out map[uint64][]string
	for _, m := range n.g.Members() {
		if m.Self || m.Liveness != gossip.LivenessAlive || !m.Candidate && !m.Stale || !m.State.EngineHealthy {
			continue // the peers routing would send an agent's steps to
		}
		for _, k := range m.State.AgentKeys {
			if out == nil {
				out = map[uint64][]string{}
			}
			out[k] = append(out[k], m.Name)
		}
	}
	return out
}
