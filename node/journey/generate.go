package journey

import (
	"context"

	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/firsttoken"
)

// The first-token bound. A request has its first token (a prefill half on a prefill node: its
// handover) within its queue TTL of its arrival at the ingress, whether it waited in the
// waiting room, in an engine's own queue, or both. The room refuses it at the TTL (429
// queue_ttl_expired); the node that runs it on its engine cancels the engine's request at the
// same instant if no token came by then (Generate), which answers 504 engine_timeout
// (firsttoken.Late). The ingress sets the deadline (Request.Due) and a forward carries what is
// left of it (transport.Header.QueueTTLLeft), so an owner, and both halves of a split request,
// hold the request to the same deadline without sharing a clock. After the first token nothing
// bounds the rest. A migrated stream's continuation is a request of its own: its first token
// is due within its queue TTL of the migration, as its admission counts it; so is a rerun
// after an owner failed past the deadline (a dispatch), whose engine had given one.

// Generate runs p on the engine (traced), its adapter loaded first, and bounds its wait for
// the first token by p.Due
// (firsttoken.Bound): past it, the engine's request is cancelled and Generate or Recv
// returns a *firsttoken.Late. A request already past its deadline does not reach the engine.
func (x *Executor) Generate(ctx context.Context, p *Request) (engine.Stream, error) {
	release, err := x.adapters.Acquire(ctx, p.Req.Model) // the step before the engine: its adapter loaded
	if err != nil {
		return nil, err
	}
	st, err := x.generateLoaded(ctx, p)
	if err != nil {
		release()
		return nil, err
	}
	return &heldStream{Stream: st, release: release}, nil
}

// generateLoaded is Generate once p's adapter is loaded.
func (x *Executor) generateLoaded(ctx context.Context, p *Request) (engine.Stream, error) {
	if p.Due.IsZero() {
		return x.traced(ctx, p)
	}
	late := &firsttoken.Late{TTL: p.TTL, Prefill: p.Req.PrefillOnly}
	open := func(ctx context.Context) (engine.Stream, error) { return x.traced(ctx, p) }
	return firsttoken.Bound(ctx, p.Due, late, open, func() {
		x.log.Info("no first token within the queue TTL: engine request cancelled", "id", p.Req.ID, "ttl", p.TTL,
			"prefill", p.Req.PrefillOnly)
	})
}

// traced runs p on the engine inside an engine span, which ends with the stream.
func (x *Executor) traced(ctx context.Context, p *Request) (engine.Stream, error) {
	return x.spans.Engine(ctx, x.eng, &p.Req, func(err error) string { return EngineError(err).Code })
}

// heldStream releases its adapter's hold when closed.
type heldStream struct {
	engine.Stream
	release func()
}

func (s *heldStream) Close() error {
	err := s.Stream.Close()
	s.release()
	return err
}
