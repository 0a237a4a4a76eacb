package node

import (
	"context"

	"github.com/kvmesh/kvmesh/node/adapters"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/firsttoken"
	"github.com/kvmesh/kvmesh/node/journey"
)

// The first-token bound. A request has its first token (a prefill half on a prefill node: its
// handover) within its queue TTL of its arrival at the ingress, whether it waited in the
// waiting room, in an engine's own queue, or both. The room refuses it at the TTL (429
// queue_ttl_expired); the node that runs it on its engine cancels the engine's request at the
// same instant if no token came by then (generate), which answers 504 engine_timeout
// (firsttoken.Late). The ingress sets the deadline (prepared.due) and a forward carries what is
// left of it (transport.Header.QueueTTLLeft), so an owner, and both halves of a split request,
// hold the request to the same deadline without sharing a clock. After the first token nothing
// bounds the rest. A migrated stream's continuation is a request of its own: its first token
// is due within its queue TTL of the migration, as its admission counts it; so is a rerun
// after an owner failed past the deadline (dispatch), whose engine had given one.

// generate runs p on the engine (traced) and bounds its wait for the first token by p.due
// (firsttoken.Bound): past it, the engine's request is cancelled and Generate or Recv returns
// a *firsttoken.Late. A request already past its deadline does not reach the engine.
func (n *Node) generate(ctx context.Context, p *journey.Request) (engine.Stream, error) {
	release, err := n.adapters.Acquire(ctx, p.Req.Model) // the step before the engine: its adapter loaded
	if err != nil {
		return nil, err
	}
	st, err := n.generateLoaded(ctx, p)
	if err != nil {
		release()
		return nil, err
	}
	return adapters.Held(st, release), nil
}

// generateLoaded is generate once p's adapter is loaded.
func (n *Node) generateLoaded(ctx context.Context, p *journey.Request) (engine.Stream, error) {
	if p.Due.IsZero() {
		return n.traced(ctx, p)
	}
	late := &firsttoken.Late{TTL: p.TTL, Prefill: p.Req.PrefillOnly}
	open := func(ctx context.Context) (engine.Stream, error) { return n.traced(ctx, p) }
	return firsttoken.Bound(ctx, p.Due, late, open, func() {
		n.log.Info("no first token within the queue TTL: engine request cancelled", "id", p.Req.ID, "ttl", p.TTL,
			"prefill", p.Req.PrefillOnly)
	})
}
