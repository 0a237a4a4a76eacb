package plan

import (
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/carbon"
)

// Owner is the owner's authoritative check of a request a peer forwarded here, against self:
// this node as a route.Peer built from its engine's exact state (its own prefix lookup in
// PrefixBlocks). It predicts with the same functions as the ingress (route's Predict, then
// OptionOf), so that on the same state both reach the same verdict. knownAgent reports that
// this node's agent window knows req.Agent: its steps are admitted by the window, not here.
//
// The result is Accept (with the effective MaxTokens) or Refuse; a Queue verdict is a 429 with
// its code, since the ingress, not the owner, keeps the waiting room.
func (p *Planner) Owner(now time.Time, req admit.Request, self route.Peer, blockTokens int, knownAgent bool) admit.Decision {
	if p.grid != nil && req.Priority < 0 {
		if d := p.grid.Decide(now, req.Priority, nil); d.Action == carbon.ActionDefer {
			return carbonDeferred("this node's grid is over the carbon threshold", d.RetryAfter)
		}
	}
	o := p.LocalOption(req, self, blockTokens)
	d := p.adm.Recheck(now, req, o)
	if p.cfg.Agents && req.Agent != "" && d.Code == admit.CodeSLOUnattainable {
		d = p.adm.Recheck(now, WithoutSLO(req), o) // as the ingress does: see decide
	}
	if d.Action == admit.Accept || d.Status == statusBadRequest {
		return d
	}
	if p.cfg.Mode != ModeKvmesh || knownAgent {
		// A plain router's engine queues what it is sent; a known agent's window admits it.
		return admit.Decision{Action: admit.Accept, Layer: d.Layer, Code: admit.CodeAccepted, Option: 0,
			Tenant: d.Tenant, MaxTokens: d.MaxTokens, ExpectedTokens: d.ExpectedTokens, KVBlocks: d.KVBlocks}
	}
	if d.Action == admit.Queue {
		d.Action, d.Status = admit.Refuse, statusTooManyRequests
	}
	return d
}

// LocalOption is self, this node from its engine's exact state, as admission's one option
// for req: what Owner checks against, predicted as the ingress predicts every candidate.
func (p *Planner) LocalOption(req admit.Request, self route.Peer, blockTokens int) admit.Option {
	self.Self = true
	c := p.policy.Predict(p.routeRequest(req, blockTokens), &self)
	c.Name = self.Name
	return OptionOf(&c, &self, req.Priority, blockTokens)
}

// WithoutSLO is req with the SLO of an agent step decided again (AgentStepSLO).
func WithoutSLO(req admit.Request) admit.Request {
	req.TTFTSLO, req.TPOTSLO = AgentStepSLO, AgentStepSLO
	return req
}
