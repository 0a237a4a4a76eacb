package node

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/node/attempt"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/transport"
)

// Delegated routing (docs/design/routing.md#delegation). Prefix summaries travel only inside a
// model's domain, and records reach nodes outside it at the mesh-wide pace, so a node serving
// none of a request's model would route it blind: no prefix knowledge, load up to three mesh
// intervals old. Such a node hands the request to a delegate, a member of the domain chosen
// by route.Delegate on the prompt's first blocks, with the header's Delegate field set. The
// delegate runs it through its own admission, waiting room and routing, as its ingress would,
// and forwards it to the owner (or runs it): one hop more, never two, since a delegate never
// delegates. The ingress relays the delegate's answer, which relays the owner's, so the
// client reads one stream; each of the two relays migrates the request if the node it reads
// from fails mid-response. A delegate that refuses the hop itself or cannot be reached leaves
// the request to this node, which routes it itself: delegation never loses a request.

// The outcomes of kvmesh_route_delegated_total.
const (
	delegateAnswered = "delegated"   // (ingress) the delegate took the request and answered it
	delegateFallback = "fallback"    // (ingress) the delegate refused the hop or was unreachable: routed here
	delegateNone     = "no_delegate" // (ingress) no live member of the domain to hand it to: routed here
	delegateServed   = "served"      // (delegate) a request another node handed here, routed here
)

var delegateOutcomes = []string{delegateAnswered, delegateFallback, delegateNone, delegateServed}

func newDelegatedCounter() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_route_delegated_total",
		Help: "Requests for a model the ingress does not serve, handed to a member of the model's domain to route, by outcome: at the ingress delegated (the delegate answered), fallback (it refused the hop, was unreachable or failed before its first byte, so the ingress routed the request itself) or no_delegate (no live member to hand it to); at the delegate served.",
	}, []string{"outcome"})
	for _, o := range delegateOutcomes {
		c.WithLabelValues(o)
	}
	return c
}

// delegates reports whether this node hands p's routing to a delegate: it serves none of p's
// model (it is outside the model's domain, the one case where its view of the domain is
// stale: see docs/design/routing.md#delegation), route.delegate is on, and p is a client's
// request of the kvmesh policy that is no agent's step (an agent's home is known from every
// record, and its window's protocol is the ingress's).
func (n *Node) delegates(p *prepared) bool {
	if n.g == nil || n.cfg.Policy != route.PolicyKvmesh || p.origin != nil || p.req.Resume != nil || p.adm.Agent != "" {
		return false
	}
	if _, ok := n.localModel(p.adm.Model); ok {
		return false
	}
	cfg := n.planner.Policy().Config()
	return cfg.Delegates()
}

// pickDelegate is p's delegate (route.Delegate over the live members serving its model) and
// its QUIC address; "" for none.
func (n *Node) pickDelegate(p *prepared) (name, addr string) {
	members := n.g.MembersServing(nil, p.adm.Model)
	now := time.Now()
	peers := make([]route.Peer, 0, len(members))
	addrs := make([]string, 0, len(members))
	for i := range members {
		m := &members[i]
		if !m.Candidate || m.State.QUICAddr == "" {
			continue
		}
		pe := peerOf(m)
		pe.Ejected = n.eject.Ejected(now, m.Name)
		peers = append(peers, pe)
		addrs = append(addrs, m.State.QUICAddr)
	}
	key := route.DelegateKey(p.req.Blocks, xxhash.Sum64(p.req.Prompt))
	if i := route.Delegate(key, p.adm.Model, peers); i >= 0 {
		return peers[i].Name, addrs[i]
	}
	return "", ""
}

// servedBesides reports whether a candidate member other than name serves model.
func (n *Node) servedBesides(model, name string) bool {
	for _, m := range n.g.MembersServing(nil, model) {
		if m.Candidate && m.Name != name {
			return true
		}
	}
	return false
}

// delegate hands p to a delegate when this node should not route it (delegates) and relays
// the delegate's answer, whatever it is: the delegate judged the request with the domain's
// knowledge. done reports that the client was answered (or left); otherwise this node routes
// p itself.
func (n *Node) delegate(ctx context.Context, w http.ResponseWriter, p *prepared, start time.Time, explain bool) (o outcome, done bool) {
	if !n.delegates(p) {
		return outcome{}, false
	}
	// The output cap as admission's budget sets it, which a migration of the delegate's
	// stream counts what is left from; a request over budget is refused here, precisely.
	b := n.adm.Budget(p.adm)
	if b.Refused() {
		return outcome{}, false
	}
	p.req.MaxTokens = b.MaxTokens
	name, addr := n.pickDelegate(p)
	if name == "" {
		n.m.delegated.WithLabelValues(delegateNone).Inc()
		return outcome{}, false
	}
	p.ttl = n.adm.TTL(p.adm)
	p.due = start.Add(p.ttl)
	h := n.forwardHeader(p, false)
	// The client's own targets, not this node's resolution of them: the delegate fits the
	// class default to the request's size as its ingress would (admit.Request.OwnTTFT).
	h.TTFTSLO, h.TPOTSLO = p.adm.TTFTSLO, p.adm.TPOTSLO
	h.Delegate = &transport.Delegation{Explain: explain}
	fctx, span := n.startForward(ctx, name, &h)
	defer span.End()
	n.forwardSent(name)
	resp, err := n.tr.Forward(fctx, addr, h, n.forwardBody(p, name, &h))
	if err != nil {
		return n.notDelegated(ctx, p, name, addr, err, span)
	}
	n.peerReached(name)
	if failed(resp, p) {
		// What ran the request failed before its first byte, as an owner's engine may: this
		// node runs it again, as it would after a failed forward.
		_ = resp.Body.Close()
		n.m.forwards.WithLabelValues("owner_failed").Inc()
		forwardResult(span, "owner_failed", resp.Headers[HeaderReason])
		n.log.Debug("delegated request failed; routing it here", "id", p.req.ID, "delegate", name, "code", resp.Headers[HeaderReason])
		n.fallBack(p, true)
		return outcome{}, false
	}
	n.m.forwards.WithLabelValues("accepted").Inc()
	forwardResult(span, "accepted", "")
	n.m.delegated.WithLabelValues(delegateAnswered).Inc()
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
	return n.relay(ctx, w, resp, p, name, start), true
}

// notDelegated sorts err, the failure of p's delegation to name at addr: the client left
// (done), or the request falls back to this node's own routing.
func (n *Node) notDelegated(ctx context.Context, p *prepared, name, addr string, err error, span trace.Span) (outcome, bool) {
	if ctx.Err() != nil {
		forwardResult(span, "unreachable", openai.CodeClientClosed)
		return outcome{code: openai.CodeClientClosed, refused: true}, true
	}
	var ref *transport.Refusal
	if errors.As(err, &ref) {
		n.m.forwards.WithLabelValues("refused").Inc()
		forwardResult(span, "refused", ref.Code)
		n.peerReached(name)
		n.log.Debug("delegate refused; routing the request here", "id", p.req.ID, "delegate", name, "code", ref.Code)
		n.fallBack(p, false)
		return outcome{}, false
	}
	n.m.forwards.WithLabelValues("unreachable").Inc()
	forwardResult(span, "unreachable", "")
	n.fallBack(p, true)
	// Excluded from this node's routing of p when another member serves the model, as a
	// failed owner is from a migration's: a second forward to it would cost another handshake
	// timeout. The model's only member stays a candidate, so the request meets its failure
	// (502 owner_unreachable) at once rather than waiting out its TTL for no candidate.
	if n.servedBesides(p.adm.Model, name) {
		p.exclude = append(p.exclude, name)
	}
	if errors.Is(err, transport.ErrUnreachable) && !errors.Is(err, transport.ErrRejected) {
		n.peerFailed(p.req.ID, name, addr, err)
	}
	n.log.Warn("delegate unreachable; routing the request here", "id", p.req.ID, "delegate", name, "err", err)
	return outcome{}, false
}

// failed reports whether resp, a delegate's answer to p, is a failure before the first byte
// that another node may not meet (as send sorts an owner's): a 5xx, except an engine_timeout
// past p's deadline, which has passed everywhere and so is the client's answer. Any other
// answer, a refusal by the delegate's admission included, is the client's: the delegate
// judged the request with the domain's knowledge.
func failed(resp *transport.Response, p *prepared) bool {
	code := resp.Headers[HeaderReason]
	if code == openai.CodeEngineTimeout && !time.Now().Before(p.due) {
		return false
	}
	return resp.Status >= 500 || code == openai.CodeClientClosed
}

// fallBack readies p, whose delegation did not answer, for this node's own routing. After a
// failure (rather than a refusal) the request may have run on the delegate's side until
// then: like a rerun after a failed forward, it gets its first-token deadline afresh, once,
// when that has passed.
func (n *Node) fallBack(p *prepared, failure bool) {
	n.m.delegated.WithLabelValues(delegateFallback).Inc()
	if failure {
		p.due, p.renewed = attempt.Renew(time.Now(), p.due, p.ttl, p.renewed)
		return
	}
	p.ttl, p.due = 0, time.Time{} // admitAndDispatch sets them
}

// serveDelegated routes p, a request an ingress outside its model's domain handed here (h),
// as this node's own ingress would: its admission and waiting room hold it, its routing
// picks the owner, and the answer goes back to the ingress on fw. It never delegates again.
func (n *Node) serveDelegated(ctx context.Context, h transport.Header, p *prepared, received time.Time, fw transport.ResponseWriter,
	refuse func(status int, code, msg string, retry time.Duration), span trace.Span) {
	if _, ok := n.localModel(p.adm.Model); !ok {
		refuse(http.StatusNotFound, admit.CodeModelNotFound, "this node does not serve "+p.adm.Model, 0)
		return
	}
	start := received.Add(-h.Waited)
	fromHeader(p, h, received, start)
	p.adm.QueueTTL = h.QueueTTL // the ingress's TTL, which this node's may only shorten
	n.m.delegated.WithLabelValues(delegateServed).Inc()
	endOutcome(span, n.admitAndDispatch(ctx, transport.HTTPResponseWriter(fw), p, start, h.Delegate.Explain))
}
