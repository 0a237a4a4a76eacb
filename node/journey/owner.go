package journey

import (
	"context"
	"errors"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/node/attempt"
	"github.com/kvmesh/kvmesh/node/meshview"
	"github.com/kvmesh/kvmesh/node/tracing"
	"github.com/kvmesh/kvmesh/node/transport"
)

// ServeOwner runs p, a request the peer h.Ingress forwarded here (received at received), as
// its owner: a delegated request through this node's own admission and routing; else this
// node's role's check, the owner's authoritative admission with exact local state, then the
// prefill half's handover or the local run through the agent window, written to fw as it
// goes. refuse answers a refusal; span is the owner's server span.
func (x *Executor) ServeOwner(ctx context.Context, h transport.Header, p *Request, received time.Time, fw transport.ResponseWriter,
	refuse func(status int, code, msg string, retry time.Duration), span trace.Span) {
	p.Req.Resume = ResumeOf(h.Resume)
	if h.Delegate != nil {
		x.ServeDelegated(ctx, h, p, received, fw, refuse, span)
		return
	}
	if why := x.takesHalf(h); why != "" {
		refuse(http.StatusServiceUnavailable, attempt.CodeWrongRole, why, 0)
		return
	}
	now := time.Now()
	start := now.Add(-h.Waited)
	FromHeader(p, h, received, start)
	a := &p.Adm
	if _, ok := x.host.LocalModel(a.Model); !ok {
		refuse(http.StatusNotFound, admit.CodeModelNotFound, "this node does not serve "+a.Model, 0)
		return
	}
	d := x.ownerDecision(now, p, h.Ingress)
	x.m.DecisionOf(d)
	traceOwnerDecision(span, p, d)
	if d.Refused() {
		refuse(d.Status, d.Code, d.Message, d.RetryAfter)
		return
	}
	p.Req.MaxTokens = d.MaxTokens
	if h.Prefill {
		EndOutcome(span, x.ServePrefill(ctx, transport.HTTPResponseWriter(fw), p))
		return
	}
	hw := transport.HTTPResponseWriter(fw)
	p.MoveBreak = true
	o, ran := x.AgentStep(ctx, hw, p, start, "peer")
	if !ran {
		refuse(http.StatusTooManyRequests, CodeAgentPaused, "agent "+a.Agent+" is outside this node's window", x.cfg.AgentInterval)
		return
	}
	if o.Broke != nil {
		x.reportBroken(fw, hw, p, h.Ingress, o)
	}
	EndOutcome(span, o)
}

// reportBroken tells ingress that this node's engine failed on p, a request it forwarded
// (o.Broke): before the answer began, with a 502 like any engine failure before the first
// token (the ingress runs the request on its next candidate); after, by ending the stream
// with the failure instead of an error event, so that the ingress, which holds what the client
// was sent and the request's count of moves, migrates it as for an owner that died.
func (x *Executor) reportBroken(fw transport.ResponseWriter, w http.ResponseWriter, p *Request, ingress string, o Outcome) {
	if !o.Begun {
		WriteRefusal(w, o.Broke, 0)
		return
	}
	x.log.Warn("engine failed mid-response; the ingress moves the request", "id", p.Req.ID, "ingress", ingress, "err", o.Broke.Message)
	_ = fw.Fail(errors.New(o.Broke.Message))
}

// ownerDecision is this node's authoritative decision, with its exact state, on p, forwarded
// by ingress.
func (x *Executor) ownerDecision(now time.Time, p *Request, ingress string) admit.Decision {
	a := &p.Adm
	known := false // the steps of an agent this node's window knows are admitted by the window
	if g := x.agents; g != nil && a.Agent != "" {
		_, known = g.Registry().Get(a.Agent)
	}
	self := x.host.SelfPeer(p.Req.Blocks)
	self.KVBlocksUsed += x.host.ClaimedHere(meshview.Rank{Priority: a.Priority, Arrived: a.Arrived}, ingress)
	self.AdapterLoad = x.adapters.Load(a.Model) // the load is a step before the first token
	if p.Req.Handover != nil {
		// The prompt arrives as KV: no prefill here, so its TTFT is a step (its blocks still
		// count against the KV, as admission counts a whole prompt, cached or not).
		self.PrefixBlocks = len(p.Req.Blocks)
	}
	return x.planner.Owner(now, *a, self, BlockTokens(x.eng), known)
}

// splits reports whether this node's engine can run either half of a split request: the
// embedded engine can, and an external one in a prefill or decode role (a vLLM server with a
// KV connector, whose handover is its kv_transfer_params).
func (x *Executor) splits() bool { return x.cfg.Embedded || route.IsHalf(x.cfg.Role) }

// takesHalf says why this node does not run the forwarded request h marks ("" when it does).
func (x *Executor) takesHalf(h transport.Header) string {
	half := h.Prefill || h.Handover != nil
	switch {
	case half && !x.splits():
		return "this node's engine runs whole requests only"
	case h.Handover != nil && (len(h.Handover.Params) > 0) != (!x.cfg.Embedded):
		// An external engine decodes only from its own kind's transfer parameters, and the
		// embedded one only from the embedded engine's KV.
		return "the handover comes from another kind of engine than this node's"
	case x.cfg.Role == route.RolePrefill && !h.Prefill:
		return "this node runs the prefill half of a request only"
	case x.cfg.Role == route.RoleDecode && h.Prefill:
		return "this node does not run the prefill half of a request"
	case x.cfg.Role == route.RoleDecode && h.Handover == nil && !x.LocalPrefill():
		return "this node decodes from a handover only (route.decode_local_prefill is off)"
	}
	return ""
}

// LocalPrefill reports whether this node, in the decode role, runs a whole request it is given
// (route.decode_local_prefill, as the last reload left it).
func (x *Executor) LocalPrefill() bool {
	cfg := x.planner.Policy().Config()
	return cfg.LocalPrefill()
}

// traceOwnerDecision records the owner's admission check of p.
func traceOwnerDecision(span trace.Span, p *Request, d admit.Decision) {
	tracing.Model(span, p.Adm.Model)
	tracing.Decision(span, d.Action.String(), d.Layer, d.Code)
}
