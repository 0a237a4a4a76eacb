package journey

import (
	"context"
	"net/http"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/agent"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/openai"
)

// AgentStep is what the local serving path does with an agent step: run it (Executor.ServeLocal with
// the window's bookkeeping around it) or, when the agent is outside the window, report parked
// so the caller answers "wait". Requests without an agent, or with agent admission off, run.
func (x *Executor) AgentStep(ctx context.Context, w http.ResponseWriter, p *Request, start time.Time, origin string) (Outcome, bool) {
	g := x.agents
	if g == nil || p.Adm.Agent == "" {
		return x.ServeLocal(ctx, w, p, start, origin), true
	}
	id := p.Adm.Agent
	run, err := g.Arrive(time.Now(), p, id, p.Adm.PromptTokens, origin == "local")
	if !run {
		return Outcome{}, false
	}
	o := x.ServeLocal(ctx, w, p, start, origin)
	if err != nil {
		// ErrFull: every registered agent is mid-step; the step ran unprotected rather than
		// fail, as request-level admission already accepted it.
		x.log.Debug("agent registry", "agent", id, "err", err)
	}
	// The client said this was the agent's last step (Request.AgentFinal), whatever its outcome: the
	// slot and the KV the window kept for it go to the next agent now.
	g.Ran(time.Now(), p, id, err == nil, p.AgentFinal, p.Req.Blocks)
	return o, true
}

// ObserveAgent records a completed step's cache outcome (called from finished, before the
// step's StepDone) for the recompute-avoided count, and its final context length.
func (x *Executor) ObserveAgent(p *Request, u *engine.Usage) {
	g := x.agents
	if g == nil || p.Adm.Agent == "" || x.cfg.Standalone {
		return // Standalone serves without the window (no AgentStep to collect the context)
	}
	g.Observe(p, p.Adm.Agent, u.CachedTokens, u.PromptTokens, u.CompletionTokens)
}

// AgentRefused handles a dispatch attempt the agent window of peer (at addr) turned down: the
// step must wait, at the same home, so dispatch must not try other candidates. It reports
// whether it was such a refusal.
func (x *Executor) AgentRefused(p *Request, peer, addr string, res *Result) bool {
	if x.agents == nil || p.Adm.Agent == "" || res.LastCode != CodeAgentPaused {
		return false
	}
	res.Requeue = true
	p.Parked = Parking{Home: peer, Addr: addr}
	x.Stick(p, peer) // the window and the prefix are there: the retry must go there too
	return true
}

// AwaitAgent keeps a step whose agent is outside its home's window until the agent is let in
// (this node is the home and wakes it, or a peer is and answers its renewal), the step's queue
// TTL ends, the client leaves or the node drains. It then decides again, or answers the
// client and reports done. The step waits here, not in the waiting room, so it cannot block
// the requests queued behind it there, and it asks a peer home with renewals, which keep the
// home's lease on the agent's place, rather than by sending the step again.
func (x *Executor) AwaitAgent(ctx context.Context, w http.ResponseWriter, p *Request, t *Ticket) (Outcome, bool) {
	g := x.agents
	expires := x.adm.Item(p.Adm, t.D).Expires
	for {
		id, wake, here := g.Parked(p)
		in := true // the agent may be in the window, or gone from the registry: decide again
		if here {
			x.pauseAgent(ctx, wake, expires)
			in = g.MayRun(id)
		} else {
			st, err := x.renewAtHome(ctx, p, max(min(x.cfg.AgentInterval, time.Until(expires)), 0))
			if err != nil {
				// The home did not answer (unreachable, or too old to know the message): route
				// the step again after an interval, which asks with the step itself.
				x.log.Debug("agent lease", "agent", p.Adm.Agent, "home", p.Parked.Home, "err", err)
				x.pauseAgent(ctx, nil, expires)
			}
			in = err != nil || st == agent.Active || st == agent.Absent
		}
		now := time.Now()
		var giveUp *admit.Decision
		switch {
		case ctx.Err() != nil:
			return Outcome{Code: openai.CodeClientClosed, Refused: true}, true
		case x.host.Draining() || g.Stopped():
			d := x.DrainingRefusal()
			giveUp = &d
		case !now.Before(expires):
			d := x.adm.Expired(now)
			giveUp = &d
		}
		if giveUp != nil {
			x.m.DecisionOf(*giveUp)
			WriteRefusal(w, RefusalOf(*giveUp), giveUp.RetryAfter)
			return Outcome{Code: giveUp.Code, Refused: true}, true
		}
		if !in {
			continue
		}
		if here {
			// Routing may now send the step elsewhere, so this node stops tracking it as
			// parked; its parking (p.Parked) stays until it runs or is given up.
			g.Unpark(p)
		}
		// The window wait is admission's own doing, bounded by the queue TTL: the step's TTFT
		// SLO counts from here, so the checks ahead do not refuse it for time spent parked.
		p.Adm.SLOStart = now
		x.Decide(now, p, t, nil, nil)
		x.m.DecisionOf(t.D)
		return Outcome{}, false
	}
}

// pauseAgent waits until wake closes (nil: never), an interval passes, expires comes, ctx
// ends or the agent control loop stops.
func (x *Executor) pauseAgent(ctx context.Context, wake <-chan struct{}, expires time.Time) {
	x.agents.Pause(ctx, wake, min(x.cfg.AgentInterval, time.Until(expires)))
}

// DrainingRefusal is the answer to a request a draining node will not run.
func (x *Executor) DrainingRefusal() admit.Decision {
	return admit.Decision{Action: admit.Refuse, Status: http.StatusServiceUnavailable, Layer: admit.LayerQueue,
		Code: CodeDraining, Message: "the node is shutting down", RetryAfter: x.planner.Config().RetryAfter, Option: -1}
}
