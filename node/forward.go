package node

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/journey"
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
	p, oerr := n.api.PrepareForward(ep, h, body)
	if oerr != nil {
		refuse(oerr.Status, oerr.Code, oerr.Message, 0)
		return
	}
	n.x.ServeOwner(ctx, h, p, received, fw, refuse, span)
}
