package journey

import (
	"context"
	"net/http"
	"time"

	"github.com/kvmesh/kvmesh/admit/agent"
	"github.com/kvmesh/kvmesh/node/agentgate"
	"github.com/kvmesh/kvmesh/node/transport"
)

// The lease messages of agent admission, sent by an ingress that keeps a step parked for a
// peer home's window: forwards of kind transport.KindAgentRenew or KindAgentGiveUp with the
// agent in AgentID and an empty body, answered with an accept carrying the agent's state
// (agent.State's String) in headerAgentState. A renewal says the ingress still keeps a step of
// the agent: the home renews its lease on the agent's place and, if the agent is outside the
// window, waits up to RenewWait (at most an interval) for it to be let in before it answers,
// so the ingress learns of a free slot at once without sending the step's body again and
// again. The ingress renews every interval for as long as it keeps the step, whether it waits
// for the window or, let in, for KV room in its waiting room. A give-up says the step ended
// without running (queue TTL, client gone, drain): the home abandons the agent now rather than
// when the lease runs out. A node that does not know the kinds refuses them, and the ingress
// routes the step again each interval.
const headerAgentState = "X-Kvmesh-Agent-State"

// renewAtHome renews the lease of p's parked step at its peer home and returns the agent's
// state there, after waiting up to wait (at the home) for the agent to be let into the window.
func (x *Executor) renewAtHome(ctx context.Context, p *Request, wait time.Duration) (agent.State, error) {
	ctx, cancel := context.WithTimeout(ctx, wait+x.cfg.AgentInterval)
	defer cancel()
	resp, err := x.tr.Forward(ctx, p.Parked.Addr, x.leaseHeader(p, transport.KindAgentRenew, wait), nil)
	if err != nil {
		return agent.Absent, err
	}
	_ = resp.Body.Close()
	return agentgate.ParseState(resp.Headers[headerAgentState]), nil
}

// leaseHeader is the forward header of an agent-lease message about p's step.
func (x *Executor) leaseHeader(p *Request, kind transport.Kind, wait time.Duration) transport.Header {
	return transport.Header{Kind: kind, RequestID: p.Req.ID, Hops: 1, Priority: p.Adm.Priority, Tenant: p.Adm.Tenant,
		AgentID: p.Adm.Agent, Ingress: x.cfg.Name, RenewWait: wait}
}

// RenewLease renews the home's lease on the agent of p's step while the step waits in this
// node's waiting room (let into the window, it waits for KV room there; or its home was not
// reachable): the home must keep the agent's place, or the slot it was let into, for it.
func (x *Executor) RenewLease(ctx context.Context, p *Request) {
	g := x.agents
	switch {
	case g == nil || p.Parked.Home == "":
	case p.Parked.Home == x.cfg.Name:
		g.Renew(time.Now(), p.Adm.Agent)
	default:
		if _, err := x.renewAtHome(ctx, p, 0); err != nil {
			x.log.Debug("agent lease", "agent", p.Adm.Agent, "home", p.Parked.Home, "err", err)
		}
	}
}

// GiveUpAgent tells the home whose window parked p's step, if any, that the step ended
// without running, so its agent does not keep its place in the queue, or a slot it was let
// into for this step, until the lease runs out.
func (x *Executor) GiveUpAgent(p *Request) {
	g, at := x.agents, p.Parked
	p.Parked = Parking{}
	switch {
	case g == nil || at.Home == "":
	case at.Home == x.cfg.Name:
		g.GiveUp(time.Now(), p, p.Adm.Agent)
	default:
		ctx, cancel := context.WithTimeout(context.Background(), x.cfg.AgentInterval)
		defer cancel()
		resp, err := x.tr.Forward(ctx, at.Addr, x.leaseHeader(p, transport.KindAgentGiveUp, 0), nil)
		if err != nil {
			x.log.Debug("agent give-up", "agent", p.Adm.Agent, "home", at.Home, "err", err)
			return // the home's lease runs out instead
		}
		_ = resp.Body.Close()
	}
}

// ServeAgentLease answers a peer ingress's renewal or give-up (transport.KindAgentRenew,
// KindAgentGiveUp) of a parked step of agent h.AgentID.
func (x *Executor) ServeAgentLease(ctx context.Context, h transport.Header, fw transport.ResponseWriter) {
	g, st := x.agents, agent.Absent
	if g != nil && h.AgentID != "" {
		now := time.Now()
		if h.Kind == transport.KindAgentGiveUp {
			g.GiveUp(now, nil, h.AgentID)
		} else {
			st = g.RenewWait(ctx, now, h.AgentID, min(h.RenewWait, x.cfg.AgentInterval))
		}
	}
	_ = fw.Accept(http.StatusOK, map[string]string{headerAgentState: st.String()})
}
