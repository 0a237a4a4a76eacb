package journey

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/cespare/xxhash/v2"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/node/attempt"
	"github.com/kvmesh/kvmesh/node/meshview"
	"github.com/kvmesh/kvmesh/node/metrics"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/tracing"
	"github.com/kvmesh/kvmesh/node/transport"
)

// Delegated routing (docs/design/routing.md#delegation). Prefix summaries travel only inside a
// model's domain, and records reach nodes outside it at the mesh-wide pace, so a node serving
// none of a request's model would route it blind: no prefix knowledge, load up to three mesh
// intervals old. Such a node hands the request to a delegate, a member of the domain chosen
// by route.Delegate on the prompt's first blocks, with the header's Delegate field set. The
// Delegate runs it through its own admission, waiting room and routing, as its ingress would,
// and forwards it to the owner (or runs it): one hop more, never two, since a delegate never
// delegates. The ingress relays the delegate's answer, which relays the owner's, so the
// client reads one stream; each of the two relays migrates the request if the node it reads
// from fails mid-response. A delegate that refuses the hop itself or cannot be reached leaves
// the request to this node, which routes it itself: delegation never loses a request.

// delegates reports whether this node hands p's routing to a delegate: it serves none of p's
// model (it is outside the model's domain, the one case where its view of the domain is
// stale: see docs/design/routing.md#delegation), route.delegate is on, and p is a client's
// request of the kvmesh policy that is no agent's step (an agent's home is known from every
// record, and its window's protocol is the ingress's).
func (x *Executor) delegates(p *Request) bool {
	if x.g == nil || x.cfg.Policy != route.PolicyKvmesh || p.Origin != nil || p.Req.Resume != nil || p.Adm.Agent != "" {
		return false
	}
	if _, ok := x.host.LocalModel(p.Adm.Model); ok {
		return false
	}
	cfg := x.planner.Policy().Config()
	return cfg.Delegates()
}

// pickDelegate is p's delegate (route.Delegate over the live members serving its model) and
// its QUIC address; "" for none.
func (x *Executor) pickDelegate(p *Request) (name, addr string) {
	members := x.g.MembersServing(nil, p.Adm.Model)
	now := time.Now()
	peers := make([]route.Peer, 0, len(members))
	addrs := make([]string, 0, len(members))
	for i := range members {
		m := &members[i]
		if !m.Candidate || m.State.QUICAddr == "" {
			continue
		}
		pe := meshview.PeerOf(m)
		pe.Ejected = x.eject.Ejected(now, m.Name)
		peers = append(peers, pe)
		addrs = append(addrs, m.State.QUICAddr)
	}
	key := route.DelegateKey(p.Req.Blocks, xxhash.Sum64(p.Req.Prompt))
	if i := route.Delegate(key, p.Adm.Model, peers); i >= 0 {
		return peers[i].Name, addrs[i]
	}
	return "", ""
}

// servedBesides reports whether a candidate member other than name serves model.
func (x *Executor) servedBesides(model, name string) bool {
	for _, m := range x.g.MembersServing(nil, model) {
		if m.Candidate && m.Name != name {
			return true
		}
	}
	return false
}

// Delegate hands p to a delegate when this node should not route it (delegates) and relays
// the delegate's answer, whatever it is: the delegate judged the request with the domain's
// knowledge. done reports that the client was answered (or left); otherwise this node routes
// p itself.
func (x *Executor) Delegate(ctx context.Context, w http.ResponseWriter, p *Request, start time.Time, explain bool) (o Outcome, done bool) {
	if !x.delegates(p) {
		return Outcome{}, false
	}
	// The output cap as admission's budget sets it, which a migration of the delegate's
	// stream counts what is left from; a request over budget is refused here, precisely.
	b := x.adm.Budget(p.Adm)
	if b.Refused() {
		return Outcome{}, false
	}
	p.Req.MaxTokens = b.MaxTokens
	name, addr := x.pickDelegate(p)
	if name == "" {
		x.m.Delegated.WithLabelValues(metrics.DelegateNone).Inc()
		return Outcome{}, false
	}
	p.TTL = x.adm.TTL(p.Adm)
	p.Due = start.Add(p.TTL)
	h := x.ForwardHeader(p, false)
	// The client's own targets, not this node's resolution of them: the delegate fits the
	// class default to the request's size as its ingress would (admit.Request.OwnTTFT).
	h.TTFTSLO, h.TPOTSLO = p.Adm.TTFTSLO, p.Adm.TPOTSLO
	h.Delegate = &transport.Delegation{Explain: explain}
	fctx, span := x.spans.Forward(ctx, name, &h)
	defer span.End()
	x.forwardSent(name)
	resp, err := x.tr.Forward(fctx, addr, h, x.forwardBody(p, name, &h))
	if err != nil {
		return x.notDelegated(ctx, p, name, addr, err, span)
	}
	x.PeerReached(name)
	if failed(resp, p) {
		// What ran the request failed before its first byte, as an owner's engine may: this
		// node runs it again, as it would after a failed forward.
		_ = resp.Body.Close()
		x.m.Forwards.WithLabelValues("owner_failed").Inc()
		tracing.ForwardResult(span, "owner_failed", resp.Headers[HeaderReason])
		x.log.Debug("delegated request failed; routing it here", "id", p.Req.ID, "delegate", name, "code", resp.Headers[HeaderReason])
		x.fallBack(p, true)
		return Outcome{}, false
	}
	x.m.Forwards.WithLabelValues("accepted").Inc()
	tracing.ForwardResult(span, "accepted", "")
	x.m.Delegated.WithLabelValues(metrics.DelegateAnswered).Inc()
	if explain {
		e := "delegate=" + name
		if v := resp.Headers[HeaderExplain]; v != "" {
			e += "; " + v
		}
		resp.Headers[HeaderExplain] = e
	}
	if v := resp.Headers[HeaderPrefillNode]; v != "" {
		w.Header().Set(HeaderPrefillNode, v) // the delegate split it: its to name
	}
	return x.Relay(ctx, w, resp, p, name, start), true
}

// notDelegated sorts err, the failure of p's delegation to name at addr: the client left
// (done), or the request falls back to this node's own routing.
func (x *Executor) notDelegated(ctx context.Context, p *Request, name, addr string, err error, span trace.Span) (Outcome, bool) {
	if ctx.Err() != nil {
		tracing.ForwardResult(span, "unreachable", openai.CodeClientClosed)
		return Outcome{Code: openai.CodeClientClosed, Refused: true}, true
	}
	var ref *transport.Refusal
	if errors.As(err, &ref) {
		x.m.Forwards.WithLabelValues("refused").Inc()
		tracing.ForwardResult(span, "refused", ref.Code)
		x.PeerReached(name)
		x.log.Debug("delegate refused; routing the request here", "id", p.Req.ID, "delegate", name, "code", ref.Code)
		x.fallBack(p, false)
		return Outcome{}, false
	}
	x.m.Forwards.WithLabelValues("unreachable").Inc()
	tracing.ForwardResult(span, "unreachable", "")
	x.fallBack(p, true)
	// Excluded from this node's routing of p when another member serves the model, as a
	// failed owner is from a migration's: a second forward to it would cost another handshake
	// timeout. The model's only member stays a candidate, so the request meets its failure
	// (502 owner_unreachable) at once rather than waiting out its TTL for no candidate.
	if x.servedBesides(p.Adm.Model, name) {
		p.Exclude = append(p.Exclude, name)
	}
	if errors.Is(err, transport.ErrUnreachable) && !errors.Is(err, transport.ErrRejected) {
		x.PeerFailed(p.Req.ID, name, addr, err)
	}
	x.log.Warn("delegate unreachable; routing the request here", "id", p.Req.ID, "delegate", name, "err", err)
	return Outcome{}, false
}

// failed reports whether resp, a delegate's answer to p, is a failure before the first byte
// that another node may not meet (as send sorts an owner's): a 5xx, except an engine_timeout
// past p's deadline, which has passed everywhere and so is the client's answer. Any other
// answer, a refusal by the delegate's admission included, is the client's: the delegate
// judged the request with the domain's knowledge.
func failed(resp *transport.Response, p *Request) bool {
	code := resp.Headers[HeaderReason]
	if code == openai.CodeEngineTimeout && !time.Now().Before(p.Due) {
		return false
	}
	return resp.Status >= 500 || code == openai.CodeClientClosed
}

// fallBack readies p, whose delegation did not answer, for this node's own routing. After a
// failure (rather than a refusal) the request may have run on the delegate's side until
// then: like a rerun after a failed forward, it gets its first-token deadline afresh, once,
// when that has passed.
func (x *Executor) fallBack(p *Request, failure bool) {
	x.m.Delegated.WithLabelValues(metrics.DelegateFallback).Inc()
	if failure {
		p.Due, p.Renewed = attempt.Renew(time.Now(), p.Due, p.TTL, p.Renewed)
		return
	}
	p.TTL, p.Due = 0, time.Time{} // AdmitAndDispatch sets them
}

// ServeDelegated routes p, a request an ingress outside its model's domain handed here (h),
// as this node's own ingress would: its admission and waiting room hold it, its routing
// picks the owner, and the answer goes back to the ingress on fw. It never delegates again.
func (x *Executor) ServeDelegated(ctx context.Context, h transport.Header, p *Request, received time.Time, fw transport.ResponseWriter,
	refuse func(status int, code, msg string, retry time.Duration), span trace.Span) {
	if _, ok := x.host.LocalModel(p.Adm.Model); !ok {
		refuse(http.StatusNotFound, admit.CodeModelNotFound, "this node does not serve "+p.Adm.Model, 0)
		return
	}
	start := received.Add(-h.Waited)
	FromHeader(p, h, received, start)
	p.Adm.QueueTTL = h.QueueTTL // the ingress's TTL, which this node's may only shorten
	x.m.Delegated.WithLabelValues(metrics.DelegateServed).Inc()
	EndOutcome(span, x.AdmitAndDispatch(ctx, transport.HTTPResponseWriter(fw), p, start, h.Delegate.Explain))
}
