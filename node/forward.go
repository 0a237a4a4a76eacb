package node

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/node/api"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/journey"
	"github.com/kvmesh/kvmesh/node/meshview"
	"github.com/kvmesh/kvmesh/node/transport"
)

// CodeHopLimit is the refusal of a request forwarded more often than MaxHops.
const CodeHopLimit = journey.CodeHopLimit

// MaxHops is the hop limit of a forward: the ingress sends a request to an owner, which runs it.
const MaxHops = 1

// ServeForward runs a request a peer forwarded here: the owner's authoritative check with exact
// local state, then the same local serving path as a client request, relayed back as it is
// written. It implements transport.Handler.
func (n *Node) ServeForward(ctx context.Context, h transport.Header, body []byte, fw transport.ResponseWriter) {
	received := time.Now() // h.QueueTTLLeft counts from here
	n.forwardReceived(h.Ingress)
	n.forwarded.Add(1)
	defer n.forwarded.Add(-1)
	ctx, span := n.startOwner(ctx, h)
	defer span.End()
	refuse := func(status int, code, msg string, retry time.Duration) {
		spanError(span, code)
		st, _ := gossip.EncodeState(n.localState())
		_ = fw.Refuse(transport.Refusal{Status: status, Code: code, Message: msg, RetryAfter: retry, State: st})
	}
	if h.Hops > MaxHops {
		refuse(http.StatusLoopDetected, CodeHopLimit, fmt.Sprintf("forwarded %d times; the limit is %d", h.Hops, MaxHops), 0)
		return
	}
	if n.isDraining() {
		d := n.x.DrainingRefusal()
		refuse(d.Status, d.Code, d.Message, d.RetryAfter)
		return
	}
	ep := engine.Chat
	switch {
	case h.Kind == transport.KindAgentRenew || h.Kind == transport.KindAgentGiveUp:
		n.x.ServeAgentLease(ctx, h, fw)
		return
	case h.Endpoint == transport.EndpointEmbeddings || h.Endpoint == transport.EndpointResponses:
		n.api.ServeSimpleForward(ctx, h, body, fw, refuse)
		return
	case h.Endpoint == transport.EndpointCompletions:
		ep = engine.Completion
	}
	p, oerr := n.api.Prepare(ep, h.RequestID, body)
	if oerr != nil {
		refuse(oerr.Status, oerr.Code, oerr.Message, 0)
		return
	}
	p.Req.Resume = journey.ResumeOf(h.Resume)
	if h.Delegate != nil {
		n.x.ServeDelegated(ctx, h, p, received, fw, refuse, span)
		return
	}
	if why := n.takesHalf(h); why != "" {
		refuse(http.StatusServiceUnavailable, CodeWrongRole, why, 0)
		return
	}
	now := time.Now()
	start := now.Add(-h.Waited)
	journey.FromHeader(p, h, received, start)
	a := &p.Adm
	if _, ok := n.localModel(a.Model); !ok {
		refuse(http.StatusNotFound, admit.CodeModelNotFound, "this node does not serve "+a.Model, 0)
		return
	}
	d := n.ownerDecision(now, p, h.Ingress)
	n.m.DecisionOf(d)
	traceOwnerDecision(span, p, d)
	if d.Refused() {
		refuse(d.Status, d.Code, d.Message, d.RetryAfter)
		return
	}
	p.Req.MaxTokens = d.MaxTokens
	if h.Prefill {
		journey.EndOutcome(span, n.x.ServePrefill(ctx, transport.HTTPResponseWriter(fw), p))
		return
	}
	hw := transport.HTTPResponseWriter(fw)
	p.MoveBreak = true
	o, ran := n.x.AgentStep(ctx, hw, p, start, "peer")
	if !ran {
		refuse(http.StatusTooManyRequests, CodeAgentPaused, "agent "+a.Agent+" is outside this node's window", n.cfg.AgentInterval)
		return
	}
	if o.Broke != nil {
		n.reportBroken(fw, hw, p, h.Ingress, o)
	}
	journey.EndOutcome(span, o)
}

// reportBroken tells ingress that this node's engine failed on p, a request it forwarded
// (o.broke): before the answer began, with a 502 like any engine failure before the first
// token (the ingress runs the request on its next candidate); after, by ending the stream
// with the failure instead of an error event, so that the ingress, which holds what the client
// was sent and the request's count of moves, migrates it as for an owner that died.
func (n *Node) reportBroken(fw transport.ResponseWriter, w http.ResponseWriter, p *journey.Request, ingress string, o journey.Outcome) {
	if !o.Begun {
		journey.WriteRefusal(w, o.Broke, 0)
		return
	}
	n.log.Warn("engine failed mid-response; the ingress moves the request", "id", p.Req.ID, "ingress", ingress, "err", o.Broke.Message)
	_ = fw.Fail(errors.New(o.Broke.Message))
}

// ownerDecision is this node's authoritative decision, with its exact state, on p, forwarded
// by ingress.
func (n *Node) ownerDecision(now time.Time, p *journey.Request, ingress string) admit.Decision {
	a := &p.Adm
	known := false // the steps of an agent this node's window knows are admitted by the window
	if g := n.agents; g != nil && a.Agent != "" {
		_, known = g.Registry().Get(a.Agent)
	}
	self := n.selfPeer(p.Req.Blocks)
	self.KVBlocksUsed += n.claimedHere(meshview.Rank{Priority: a.Priority, Arrived: a.Arrived}, ingress)
	self.AdapterLoad = n.adapterLoad(a.Model) // the load is a step before the first token
	if p.Req.Handover != nil {
		// The prompt arrives as KV: no prefill here, so its TTFT is a step (its blocks still
		// count against the KV, as admission counts a whole prompt, cached or not).
		self.PrefixBlocks = len(p.Req.Blocks)
	}
	return n.planner.Owner(now, *a, self, api.BlockTokens(n.eng), known)
}
