package journey

import (
	"cmp"
	"context"
	"errors"
	"io"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/plan"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/relay"
	"github.com/kvmesh/kvmesh/node/tracing"
	"github.com/kvmesh/kvmesh/node/transport"
)

// forward sends p to owner, a candidate, at addr. done reports that the client got an answer (relayed
// from the owner); otherwise the owner refused, or the attempt failed (res.failCode: the owner
// could not be reached, or its engine failed, before any byte).
func (x *Executor) forward(ctx context.Context, w http.ResponseWriter, p *Request, owner, addr string, start time.Time, res *Result) (Outcome, bool) {
	resp, o, done := x.send(ctx, w, p, owner, addr, false, res)
	if resp == nil {
		return o, done
	}
	if x.g != nil && resp.Status == http.StatusOK {
		// The owner now holds (or is computing) this prefix: the next turn of the session
		// should follow before the owner's own summary arrives.
		x.g.Index().AddSpeculative(owner, p.Req.Blocks, time.Now().Add(x.cfg.SpeculativeTTL))
	}
	return x.Relay(ctx, w, resp, p, owner, start), true
}

// ForwardHeader is the header of p's forward: prefill marks the prefill half of a split
// request, and p.req.Handover, when set, makes it the decode half.
func (x *Executor) ForwardHeader(p *Request, prefill bool) transport.Header {
	ttft, tpot := x.adm.SLOFor(p.Adm)
	clock := p.Adm.SLOClock() // the arrival, or when the agent window let the step in
	h := transport.Header{
		RequestID: p.Req.ID,
		Hops:      1,
		Priority:  p.Adm.Priority,
		Tenant:    p.Adm.Tenant,
		Deadline:  clock.Add(ttft),
		AgentID:   p.Adm.Agent,
		Blocks:    p.Req.Blocks,
		Ingress:   x.cfg.Name,
		Kind:      transport.KindRequest,
		Endpoint:  EndpointOf(p.Endpoint),
		// What the owner needs to judge the request's SLOs the way the ingress would.
		Waited:     max(time.Since(clock), 0),
		TTFTSLO:    ttft,
		TPOTSLO:    tpot,
		AgentFinal: p.AgentFinal,
		Resume:     ResumeHeader(p.Req.Resume),
		Prefill:    prefill,
		Handover:   HandoverHeader(p.Req.Handover),
	}
	if !p.Due.IsZero() {
		// What is left of the queue TTL, relative so that the owner's clock need not agree;
		// at least a nanosecond, which the owner finds past before asking its engine.
		h.QueueTTL, h.QueueTTLLeft = p.TTL, min(max(time.Until(p.Due), time.Nanosecond), p.TTL)
	}
	return h
}

// send forwards p (its prefill half when prefill) to owner at addr and sorts the answer: resp
// is the owner's response when it accepted; otherwise the owner refused, or the attempt failed
// (res.failCode), and done reports that the client was answered (the request itself is
// invalid, o says how).
func (x *Executor) send(ctx context.Context, w http.ResponseWriter, p *Request, owner, addr string, prefill bool, res *Result) (resp *transport.Response, o Outcome, done bool) {
	res.FailCode = ""
	h := x.ForwardHeader(p, prefill)
	ctx, span := x.spans.Forward(ctx, owner, &h)
	defer span.End()
	if addr == "" {
		x.m.Forwards.WithLabelValues("no_address").Inc()
		tracing.ForwardResult(span, "no_address", "")
		res.FailCode = CodeOwnerUnreachable
		return nil, Outcome{}, false
	}
	x.forwardSent(owner)
	resp, err := x.tr.Forward(ctx, addr, h, x.forwardBody(p, owner, &h))
	if err != nil {
		o, done := x.notForwarded(ctx, w, p, owner, addr, err, span, res)
		return nil, o, done
	}
	x.PeerReached(owner)
	if resp.Headers[HeaderReason] == openai.CodeEngineTimeout && !p.Due.IsZero() && !time.Now().Before(p.Due) {
		// The owner's engine gave no first token within the request's queue TTL: its
		// deadline has passed everywhere, so the owner's answer is the client's. (An
		// engine_timeout before the deadline, an external engine's own, is retried below.)
		x.m.Forwards.WithLabelValues("owner_failed").Inc()
		tracing.ForwardResult(span, "owner_failed", openai.CodeEngineTimeout)
		return resp, Outcome{}, false
	}
	if resp.Headers[HeaderReason] == CodeAdapterLoadFailed {
		// The owner's engine could not load the request's adapter: every node loads it from
		// the same source, so the owner's answer is the client's.
		x.m.Forwards.WithLabelValues("owner_failed").Inc()
		tracing.ForwardResult(span, "owner_failed", CodeAdapterLoadFailed)
		return resp, Outcome{}, false
	}
	if resp.Status >= 500 || resp.Headers[HeaderReason] == openai.CodeClientClosed {
		// The owner's engine failed before the first token, or the owner dropped the request
		// (its side ended while this client waits: it is shutting down): another node may do
		// better.
		_ = resp.Body.Close()
		x.m.Forwards.WithLabelValues("owner_failed").Inc()
		res.LastCode = resp.Headers[HeaderReason]
		res.FailCode = cmp.Or(res.LastCode, openai.CodeEngineError)
		if res.LastCode == openai.CodeClientClosed {
			res.FailCode = CodeOwnerUnreachable
		}
		tracing.ForwardResult(span, "owner_failed", res.LastCode)
		return nil, Outcome{}, false
	}
	if resp.Status == http.StatusTooManyRequests {
		// The owner's engine is overloaded by its own account (an external engine's 429): the
		// owner refused, like its admission would have.
		_ = resp.Body.Close()
		x.OwnerBusy(p, owner, resp.Headers, res)
		tracing.ForwardResult(span, "refused", res.LastCode)
		return nil, Outcome{}, false
	}
	x.m.Forwards.WithLabelValues("accepted").Inc()
	tracing.ForwardResult(span, "accepted", "")
	return resp, Outcome{}, false
}

// notForwarded sorts err, the failure of a forward of p to owner at addr: the owner refused
// (res.lastCode), or the attempt failed (res.failCode); done reports that the client was
// answered (the owner found the request itself invalid, o says how).
func (x *Executor) notForwarded(ctx context.Context, w http.ResponseWriter, p *Request, owner, addr string, err error, span trace.Span, res *Result) (o Outcome, done bool) {
	var ref *transport.Refusal
	switch {
	case errors.As(err, &ref) && ref.Code == CodeIngressMismatch:
		// The owner does not take this node's certificate for its name (issued for another
		// node, or before names were bound to certificates): no forward there can succeed, so
		// it fails as a handshake would, and the peer leaves routing for a while.
		x.m.Forwards.WithLabelValues("refused").Inc()
		tracing.ForwardResult(span, "refused", ref.Code)
		res.LastCode, res.FailCode = ref.Code, ref.Code
		if d := x.eject.Failure(time.Now(), owner); d > 0 {
			x.m.Ejections.WithLabelValues(transport.FailTLS).Inc()
			x.log.Error("peer ejected from routing: it refuses this node's certificate for its name", "peer", owner, "addr", addr,
				"for", d, "id", p.Req.ID, "reason", ref.Message)
		}
		return Outcome{}, false
	case errors.As(err, &ref):
		x.PeerReached(owner)
		x.m.Forwards.WithLabelValues("refused").Inc()
		tracing.ForwardResult(span, "refused", ref.Code)
		x.log.Debug("owner refused", "id", p.Req.ID, "owner", owner, "code", ref.Code)
		res.LastCode = ref.Code
		if ref.Status == http.StatusBadRequest {
			// The owner found the request itself invalid: no other node will think otherwise.
			WriteRefusal(w, openai.NewError(ref.Status, ref.Code, ref.Message), 0)
			return Outcome{Code: ref.Code, Refused: true}, true
		}
		if ref.Status == http.StatusTooManyRequests && ref.Code != CodeAgentPaused && ref.Code != plan.CodeCarbonDeferred {
			// The owner's engine is busier than its last record: not there again until a
			// newer record says otherwise (an agent's pause and a dirty grid are not load).
			x.planner.Policy().Refused(time.Now(), owner, p.Adm.Priority)
		}
		return Outcome{}, false
	default:
		x.m.Forwards.WithLabelValues("unreachable").Inc()
		tracing.ForwardResult(span, "unreachable", "")
		res.FailCode = CodeOwnerUnreachable
		if errors.Is(err, transport.ErrUnreachable) && !errors.Is(err, transport.ErrRejected) && ctx.Err() == nil {
			x.PeerFailed(p.Req.ID, owner, addr, err)
		} else {
			x.log.Debug("forward failed", "id", p.Req.ID, "owner", owner, "err", err)
		}
		return Outcome{}, false
	}
}

// PeerFailed records a forward to peer that failed at the transport. The failure that ejects
// the peer from routing (route.Ejector) is logged as an error and counted by reason, once per
// ejection; the others only at debug level.
func (x *Executor) PeerFailed(id, peer, addr string, err error) {
	d := x.eject.Failure(time.Now(), peer)
	if d == 0 {
		x.log.Debug("owner unreachable", "id", id, "owner", peer, "err", err)
		return
	}
	reason := transport.FailureReason(err)
	x.m.Ejections.WithLabelValues(reason).Inc()
	x.log.Error("peer ejected from routing: forwards to it fail", "peer", peer, "addr", addr, "reason", reason, "for", d, "id", id, "err", err)
}

// PeerReached records a forward that reached peer, which ends any ejection of it.
func (x *Executor) PeerReached(peer string) {
	if x.eject.Success(peer) {
		x.log.Info("peer reachable again", "peer", peer)
	}
}

func EndpointOf(ep engine.Endpoint) transport.Endpoint {
	if ep == engine.Completion {
		return transport.EndpointCompletions
	}
	return transport.EndpointChat
}

// Relay answers the client with the owner's response: a stream event by event as it arrives
// (relay.Stream), anything else once it has all arrived. If the owner fails before its
// response ended (its transport breaks, or it closes a stream between two events), the
// request migrates: it continues on another node, or the client's response ends with an
// explicit error, never silently short.
func (x *Executor) Relay(ctx context.Context, w http.ResponseWriter, resp *transport.Response, p *Request, owner string, start time.Time) Outcome {
	defer resp.Body.Close()
	if o, ok := x.relayNative(ctx, w, resp, p, owner, start); ok {
		return o
	}
	if !p.Stream || resp.Status != http.StatusOK {
		return x.RelayWhole(ctx, w, resp, p, owner, start)
	}
	cs, ok := w.(*relay.Stream) // a continuation's stream goes on in the client's
	if !ok {
		cs = relay.New(w, p.Endpoint == engine.Chat, x.cfg.Migrations >= 0)
	}
	for k, v := range resp.Headers {
		if !IngressHeader(k) {
			cs.Header().Set(k, v)
		}
	}
	cs.WriteHeader(resp.Status)
	var first func() // a continuation's first bytes are not the request's first token
	if p.Origin == nil {
		first = func() { x.m.TTFT.Observe(time.Since(start).Seconds()) }
	}
	switch err := cs.Pipe(resp.Body, first); {
	case err == nil && cs.Done():
		return Outcome{Completed: true}
	case err == nil:
		return Outcome{Code: openai.CodeEngineError}
	case err == relay.ErrClientGone:
		return Outcome{Code: openai.CodeClientClosed}
	default:
		return x.Migrate(ctx, cs, p, owner, err)
	}
}

// IngressHeader reports whether k is a response header the ingress sets itself, which an
// owner's answer does not override: the client keeps this node's request id, and a split
// request's prefill node is the ingress's to name (an owner runs a half or a whole request,
// and cannot tell).
func IngressHeader(k string) bool { return k == HeaderRequestID || k == HeaderPrefillNode }

// RelayWhole reads the owner's whole response, then sends it: a client that asked for no
// stream gets nothing before the answer is complete, so an owner that fails before that can
// be replaced without the client seeing it.
func (x *Executor) RelayWhole(ctx context.Context, w http.ResponseWriter, resp *transport.Response, p *Request, owner string, start time.Time) Outcome {
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		if resp.Status == http.StatusOK {
			return x.Migrate(ctx, w, p, owner, err)
		}
		e := openai.NewError(http.StatusBadGateway, openai.CodeEngineError, "the owner node failed mid-response: "+err.Error())
		WriteRefusal(w, e, 0)
		return Outcome{Code: e.Code}
	}
	for k, v := range resp.Headers {
		if !IngressHeader(k) {
			w.Header().Set(k, v)
		}
	}
	w.WriteHeader(resp.Status)
	if resp.Status == http.StatusOK && p.Origin == nil {
		x.m.TTFT.Observe(time.Since(start).Seconds())
	}
	if _, err := w.Write(body); err != nil {
		return Outcome{Code: openai.CodeClientClosed}
	}
	if resp.Status != http.StatusOK {
		return Outcome{Code: resp.Headers[HeaderReason], Refused: resp.Status < 500}
	}
	return Outcome{Completed: true}
}

// FromHeader fills p, a request a peer forwarded here, from the forward's header h, received
// at received; start is its arrival at the ingress, on this node's clock.
func FromHeader(p *Request, h transport.Header, received, start time.Time) {
	p.Req.PrefillOnly = h.Prefill
	if h.Handover != nil {
		p.Req.Handover = HandoverOf(h.Handover, p.Req.Blocks)
	}
	if h.QueueTTLLeft > 0 {
		p.Due, p.TTL = received.Add(h.QueueTTLLeft), h.QueueTTL
	}
	a := &p.Adm
	a.Priority, a.Tenant, a.Agent, a.Arrived = h.Priority, h.Tenant, h.AgentID, start
	switch {
	case h.Prefill:
		a.Role = admit.RolePrefill // checked on the prompt's KV only
	case h.Handover != nil:
		a.Role = admit.RoleDecode // checked at the decode pool's mark
	}
	p.Req.Priority = a.Priority
	a.TTFTSLO, a.TPOTSLO = h.TTFTSLO, h.TPOTSLO
	p.AgentFinal = a.Agent != "" && h.AgentFinal
}
