package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/relay"
	"github.com/kvmesh/kvmesh/node/transport"
)

// CodeHopLimit is the refusal of a request forwarded more often than MaxHops.
const CodeHopLimit = "hop_limit"

// MaxHops is the hop limit of a forward: the ingress sends a request to an owner, which runs it.
const MaxHops = 1

// forward sends p to owner, a candidate, at addr. done reports that the client got an answer (relayed
// from the owner); otherwise the owner refused, or the attempt failed (res.failCode: the owner
// could not be reached, or its engine failed, before any byte).
func (n *Node) forward(ctx context.Context, w http.ResponseWriter, p *prepared, owner, addr string, start time.Time, res *dispatchResult) (outcome, bool) {
	resp, o, done := n.send(ctx, w, p, owner, addr, false, res)
	if resp == nil {
		return o, done
	}
	if n.g != nil && resp.Status == http.StatusOK {
		// The owner now holds (or is computing) this prefix: the next turn of the session
		// should follow before the owner's own summary arrives.
		n.g.Index().AddSpeculative(owner, p.req.Blocks, time.Now().Add(n.cfg.SpeculativeTTL))
	}
	return n.relay(ctx, w, resp, p, owner, start), true
}

// forwardHeader is the header of p's forward: prefill marks the prefill half of a split
// request, and p.req.Handover, when set, makes it the decode half.
func (n *Node) forwardHeader(p *prepared, prefill bool) transport.Header {
	ttft, tpot := n.adm.SLOFor(p.adm)
	clock := p.adm.SLOClock() // the arrival, or when the agent window let the step in
	h := transport.Header{
		RequestID: p.req.ID,
		Hops:      1,
		Priority:  p.adm.Priority,
		Tenant:    p.adm.Tenant,
		Deadline:  clock.Add(ttft),
		AgentID:   p.adm.Agent,
		Blocks:    p.req.Blocks,
		Ingress:   n.cfg.Name,
		Kind:      transport.KindRequest,
		Endpoint:  endpointOf(p.endpoint),
		// What the owner needs to judge the request's SLOs the way the ingress would.
		Waited:     max(time.Since(clock), 0),
		TTFTSLO:    ttft,
		TPOTSLO:    tpot,
		AgentFinal: p.agentFinal,
		Resume:     resumeHeader(p.req.Resume),
		Prefill:    prefill,
		Handover:   handoverHeader(p.req.Handover),
	}
	if !p.due.IsZero() {
		// What is left of the queue TTL, relative so that the owner's clock need not agree;
		// at least a nanosecond, which the owner finds past before asking its engine.
		h.QueueTTL, h.QueueTTLLeft = p.ttl, min(max(time.Until(p.due), time.Nanosecond), p.ttl)
	}
	return h
}

// send forwards p (its prefill half when prefill) to owner at addr and sorts the answer: resp
// is the owner's response when it accepted; otherwise the owner refused, or the attempt failed
// (res.failCode), and done reports that the client was answered (the request itself is
// invalid, o says how).
func (n *Node) send(ctx context.Context, w http.ResponseWriter, p *prepared, owner, addr string, prefill bool, res *dispatchResult) (resp *transport.Response, o outcome, done bool) {
	res.failCode = ""
	h := n.forwardHeader(p, prefill)
	ctx, span := n.startForward(ctx, owner, &h)
	defer span.End()
	if addr == "" {
		n.m.forwards.WithLabelValues("no_address").Inc()
		forwardResult(span, "no_address", "")
		res.failCode = CodeOwnerUnreachable
		return nil, outcome{}, false
	}
	n.forwardSent(owner)
	resp, err := n.tr.Forward(ctx, addr, h, n.forwardBody(p, owner, &h))
	if err != nil {
		o, done := n.notForwarded(ctx, w, p, owner, addr, err, span, res)
		return nil, o, done
	}
	n.peerReached(owner)
	if resp.Headers[HeaderReason] == openai.CodeEngineTimeout && !p.due.IsZero() && !time.Now().Before(p.due) {
		// The owner's engine gave no first token within the request's queue TTL: its
		// deadline has passed everywhere, so the owner's answer is the client's. (An
		// engine_timeout before the deadline, an external engine's own, is retried below.)
		n.m.forwards.WithLabelValues("owner_failed").Inc()
		forwardResult(span, "owner_failed", openai.CodeEngineTimeout)
		return resp, outcome{}, false
	}
	if resp.Headers[HeaderReason] == CodeAdapterLoadFailed {
		// The owner's engine could not load the request's adapter: every node loads it from
		// the same source, so the owner's answer is the client's.
		n.m.forwards.WithLabelValues("owner_failed").Inc()
		forwardResult(span, "owner_failed", CodeAdapterLoadFailed)
		return resp, outcome{}, false
	}
	if resp.Status >= 500 || resp.Headers[HeaderReason] == openai.CodeClientClosed {
		// The owner's engine failed before the first token, or the owner dropped the request
		// (its side ended while this client waits: it is shutting down): another node may do
		// better.
		_ = resp.Body.Close()
		n.m.forwards.WithLabelValues("owner_failed").Inc()
		res.lastCode = resp.Headers[HeaderReason]
		res.failCode = cmp.Or(res.lastCode, openai.CodeEngineError)
		if res.lastCode == openai.CodeClientClosed {
			res.failCode = CodeOwnerUnreachable
		}
		forwardResult(span, "owner_failed", res.lastCode)
		return nil, outcome{}, false
	}
	if resp.Status == http.StatusTooManyRequests {
		// The owner's engine is overloaded by its own account (an external engine's 429): the
		// owner refused, like its admission would have.
		_ = resp.Body.Close()
		n.ownerBusy(p, owner, resp.Headers, res)
		forwardResult(span, "refused", res.lastCode)
		return nil, outcome{}, false
	}
	n.m.forwards.WithLabelValues("accepted").Inc()
	forwardResult(span, "accepted", "")
	return resp, outcome{}, false
}

// notForwarded sorts err, the failure of a forward of p to owner at addr: the owner refused
// (res.lastCode), or the attempt failed (res.failCode); done reports that the client was
// answered (the owner found the request itself invalid, o says how).
func (n *Node) notForwarded(ctx context.Context, w http.ResponseWriter, p *prepared, owner, addr string, err error, span trace.Span, res *dispatchResult) (o outcome, done bool) {
	var ref *transport.Refusal
	switch {
	case errors.As(err, &ref) && ref.Code == CodeIngressMismatch:
		// The owner does not take this node's certificate for its name (issued for another
		// node, or before names were bound to certificates): no forward there can succeed, so
		// it fails as a handshake would, and the peer leaves routing for a while.
		n.m.forwards.WithLabelValues("refused").Inc()
		forwardResult(span, "refused", ref.Code)
		res.lastCode, res.failCode = ref.Code, ref.Code
		if d := n.eject.Failure(time.Now(), owner); d > 0 {
			n.m.ejections.WithLabelValues(transport.FailTLS).Inc()
			n.log.Error("peer ejected from routing: it refuses this node's certificate for its name", "peer", owner, "addr", addr,
				"for", d, "id", p.req.ID, "reason", ref.Message)
		}
		return outcome{}, false
	case errors.As(err, &ref):
		n.peerReached(owner)
		n.m.forwards.WithLabelValues("refused").Inc()
		forwardResult(span, "refused", ref.Code)
		n.log.Debug("owner refused", "id", p.req.ID, "owner", owner, "code", ref.Code)
		res.lastCode = ref.Code
		if ref.Status == http.StatusBadRequest {
			// The owner found the request itself invalid: no other node will think otherwise.
			writeRefusal(w, openai.NewError(ref.Status, ref.Code, ref.Message), 0)
			return outcome{code: ref.Code, refused: true}, true
		}
		if ref.Status == http.StatusTooManyRequests && ref.Code != CodeAgentPaused && ref.Code != CodeCarbonDeferred {
			// The owner's engine is busier than its last record: not there again until a
			// newer record says otherwise (an agent's pause and a dirty grid are not load).
			n.planner.Policy().Refused(time.Now(), owner, p.adm.Priority)
		}
		return outcome{}, false
	default:
		n.m.forwards.WithLabelValues("unreachable").Inc()
		forwardResult(span, "unreachable", "")
		res.failCode = CodeOwnerUnreachable
		if errors.Is(err, transport.ErrUnreachable) && !errors.Is(err, transport.ErrRejected) && ctx.Err() == nil {
			n.peerFailed(p.req.ID, owner, addr, err)
		} else {
			n.log.Debug("forward failed", "id", p.req.ID, "owner", owner, "err", err)
		}
		return outcome{}, false
	}
}

// peerFailed records a forward to peer that failed at the transport. The failure that ejects
// the peer from routing (route.Ejector) is logged as an error and counted by reason, once per
// ejection; the others only at debug level.
func (n *Node) peerFailed(id, peer, addr string, err error) {
	d := n.eject.Failure(time.Now(), peer)
	if d == 0 {
		n.log.Debug("owner unreachable", "id", id, "owner", peer, "err", err)
		return
	}
	reason := transport.FailureReason(err)
	n.m.ejections.WithLabelValues(reason).Inc()
	n.log.Error("peer ejected from routing: forwards to it fail", "peer", peer, "addr", addr, "reason", reason, "for", d, "id", id, "err", err)
}

// peerReached records a forward that reached peer, which ends any ejection of it.
func (n *Node) peerReached(peer string) {
	if n.eject.Success(peer) {
		n.log.Info("peer reachable again", "peer", peer)
	}
}

func endpointOf(ep engine.Endpoint) transport.Endpoint {
	if ep == engine.Completion {
		return transport.EndpointCompletions
	}
	return transport.EndpointChat
}

// relay answers the client with the owner's response: a stream event by event as it arrives
// (relay.Stream), anything else once it has all arrived. If the owner fails before its
// response ended (its transport breaks, or it closes a stream between two events), the
// request migrates: it continues on another node, or the client's response ends with an
// explicit error, never silently short.
func (n *Node) relay(ctx context.Context, w http.ResponseWriter, resp *transport.Response, p *prepared, owner string, start time.Time) outcome {
	defer resp.Body.Close()
	if o, ok := n.relayNative(ctx, w, resp, p, owner, start); ok {
		return o
	}
	if !p.stream || resp.Status != http.StatusOK {
		return n.relayWhole(ctx, w, resp, p, owner, start)
	}
	cs, ok := w.(*relay.Stream) // a continuation's stream goes on in the client's
	if !ok {
		cs = relay.New(w, p.endpoint == engine.Chat, n.cfg.Migrations >= 0)
	}
	for k, v := range resp.Headers {
		if !ingressHeader(k) {
			cs.Header().Set(k, v)
		}
	}
	cs.WriteHeader(resp.Status)
	var first func() // a continuation's first bytes are not the request's first token
	if p.origin == nil {
		first = func() { n.m.ttft.Observe(time.Since(start).Seconds()) }
	}
	switch err := cs.Pipe(resp.Body, first); {
	case err == nil && cs.Done():
		return outcome{completed: true}
	case err == nil:
		return outcome{code: openai.CodeEngineError}
	case err == relay.ErrClientGone:
		return outcome{code: openai.CodeClientClosed}
	default:
		return n.migrate(ctx, cs, p, owner, err)
	}
}

// ingressHeader reports whether k is a response header the ingress sets itself, which an
// owner's answer does not override: the client keeps this node's request id, and a split
// request's prefill node is the ingress's to name (an owner runs a half or a whole request,
// and cannot tell).
func ingressHeader(k string) bool { return k == HeaderRequestID || k == HeaderPrefillNode }

// relayWhole reads the owner's whole response, then sends it: a client that asked for no
// stream gets nothing before the answer is complete, so an owner that fails before that can
// be replaced without the client seeing it.
func (n *Node) relayWhole(ctx context.Context, w http.ResponseWriter, resp *transport.Response, p *prepared, owner string, start time.Time) outcome {
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		if resp.Status == http.StatusOK {
			return n.migrate(ctx, w, p, owner, err)
		}
		e := openai.NewError(http.StatusBadGateway, openai.CodeEngineError, "the owner node failed mid-response: "+err.Error())
		writeRefusal(w, e, 0)
		return outcome{code: e.Code}
	}
	for k, v := range resp.Headers {
		if !ingressHeader(k) {
			w.Header().Set(k, v)
		}
	}
	w.WriteHeader(resp.Status)
	if resp.Status == http.StatusOK && p.origin == nil {
		n.m.ttft.Observe(time.Since(start).Seconds())
	}
	if _, err := w.Write(body); err != nil {
		return outcome{code: openai.CodeClientClosed}
	}
	if resp.Status != http.StatusOK {
		return outcome{code: resp.Headers[HeaderReason], refused: resp.Status < 500}
	}
	return outcome{completed: true}
}

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
		d := n.drainingRefusal()
		refuse(d.Status, d.Code, d.Message, d.RetryAfter)
		return
	}
	ep := engine.Chat
	switch {
	case h.Kind == transport.KindAgentRenew || h.Kind == transport.KindAgentGiveUp:
		n.serveAgentLease(ctx, h, fw)
		return
	case h.Endpoint == transport.EndpointEmbeddings || h.Endpoint == transport.EndpointResponses:
		n.serveSimpleForward(ctx, h, body, fw, refuse)
		return
	case h.Endpoint == transport.EndpointCompletions:
		ep = engine.Completion
	}
	p, oerr := n.prepareForward(ep, h, body)
	if oerr != nil {
		refuse(oerr.Status, oerr.Code, oerr.Message, 0)
		return
	}
	p.req.Resume = resumeOf(h.Resume)
	if h.Delegate != nil {
		n.serveDelegated(ctx, h, p, received, fw, refuse, span)
		return
	}
	if why := n.takesHalf(h); why != "" {
		refuse(http.StatusServiceUnavailable, CodeWrongRole, why, 0)
		return
	}
	now := time.Now()
	start := now.Add(-h.Waited)
	fromHeader(p, h, received, start)
	a := &p.adm
	if _, ok := n.localModel(a.Model); !ok {
		refuse(http.StatusNotFound, admit.CodeModelNotFound, "this node does not serve "+a.Model, 0)
		return
	}
	d := n.ownerDecision(now, p, h.Ingress)
	n.m.decisionOf(d)
	traceOwnerDecision(span, p, d)
	if d.Refused() {
		refuse(d.Status, d.Code, d.Message, d.RetryAfter)
		return
	}
	p.req.MaxTokens = d.MaxTokens
	if h.Prefill {
		endOutcome(span, n.servePrefill(ctx, transport.HTTPResponseWriter(fw), p))
		return
	}
	hw := transport.HTTPResponseWriter(fw)
	p.moveBreak = true
	o, ran := n.agentStep(ctx, hw, p, start, "peer")
	if !ran {
		refuse(http.StatusTooManyRequests, CodeAgentPaused, "agent "+a.Agent+" is outside this node's window", n.cfg.AgentInterval)
		return
	}
	if o.broke != nil {
		n.reportBroken(fw, hw, p, h.Ingress, o)
	}
	endOutcome(span, o)
}

// reportBroken tells ingress that this node's engine failed on p, a request it forwarded
// (o.broke): before the answer began, with a 502 like any engine failure before the first
// token (the ingress runs the request on its next candidate); after, by ending the stream
// with the failure instead of an error event, so that the ingress, which holds what the client
// was sent and the request's count of moves, migrates it as for an owner that died.
func (n *Node) reportBroken(fw transport.ResponseWriter, w http.ResponseWriter, p *prepared, ingress string, o outcome) {
	if !o.begun {
		writeRefusal(w, o.broke, 0)
		return
	}
	n.log.Warn("engine failed mid-response; the ingress moves the request", "id", p.req.ID, "ingress", ingress, "err", o.broke.Message)
	_ = fw.Fail(errors.New(o.broke.Message))
}

// fromHeader fills p, a request a peer forwarded here, from the forward's header h, received
// at received; start is its arrival at the ingress, on this node's clock.
func fromHeader(p *prepared, h transport.Header, received, start time.Time) {
	p.req.PrefillOnly = h.Prefill
	if h.Handover != nil {
		p.req.Handover = handoverOf(h.Handover, p.req.Blocks)
	}
	if h.QueueTTLLeft > 0 {
		p.due, p.ttl = received.Add(h.QueueTTLLeft), h.QueueTTL
	}
	a := &p.adm
	a.Priority, a.Tenant, a.Agent, a.Arrived = h.Priority, h.Tenant, h.AgentID, start
	switch {
	case h.Prefill:
		a.Role = admit.RolePrefill // checked on the prompt's KV only
	case h.Handover != nil:
		a.Role = admit.RoleDecode // checked at the decode pool's mark
	}
	p.req.Priority = a.Priority
	a.TTFTSLO, a.TPOTSLO = h.TTFTSLO, h.TPOTSLO
	p.agentFinal = a.Agent != "" && h.AgentFinal
}

// ownerDecision is this node's authoritative decision, with its exact state, on p, forwarded
// by ingress.
func (n *Node) ownerDecision(now time.Time, p *prepared, ingress string) admit.Decision {
	a := &p.adm
	known := false // the steps of an agent this node's window knows are admitted by the window
	if g := n.agents; g != nil && a.Agent != "" {
		_, known = g.Registry().Get(a.Agent)
	}
	self := n.selfPeer(p.req.Blocks)
	self.KVBlocksUsed += n.claimedHere(rank{a.Priority, a.Arrived}, ingress)
	self.AdapterLoad = n.adapterLoad(a.Model) // the load is a step before the first token
	if p.req.Handover != nil {
		// The prompt arrives as KV: no prefill here, so its TTFT is a step (its blocks still
		// count against the KV, as admission counts a whole prompt, cached or not).
		self.PrefixBlocks = len(p.req.Blocks)
	}
	return n.planner.Owner(now, *a, self, n.blockTokens(), known)
}
