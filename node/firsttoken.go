package node

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/node/attempt"
	"github.com/kvmesh/kvmesh/node/engine"
)

// The first-token bound. A request has its first token (a prefill half on a prefill node: its
// handover) within its queue TTL of its arrival at the ingress, whether it waited in the
// waiting room, in an engine's own queue, or both. The room refuses it at the TTL (429
// queue_ttl_expired); the node that runs it on its engine cancels the engine's request at the
// same instant if no token came by then (generate), which answers 504 engine_timeout
// (firstTokenLate). The ingress sets the deadline (prepared.due) and a forward carries what is
// left of it (transport.Header.QueueTTLLeft), so an owner, and both halves of a split request,
// hold the request to the same deadline without sharing a clock. After the first token nothing
// bounds the rest. A migrated stream's continuation is a request of its own: its first token
// is due within its queue TTL of the migration, as its admission counts it; so is a rerun
// after an owner failed past the deadline (dispatch), whose engine had given one.

// firstTokenLate is the error of a generation whose first token (a prefill's handover) did not
// come within its request's queue TTL; engineError makes it a 504 engine_timeout.
type firstTokenLate struct {
	ttl     time.Duration
	prefill bool
}

func (e *firstTokenLate) Error() string {
	if e.prefill {
		return fmt.Sprintf("no handover within the queue TTL (%v): the prefill engine's queue did not reach the request", e.ttl)
	}
	return fmt.Sprintf("no first token within the queue TTL (%v): the engine's queue did not reach the request", e.ttl)
}

// generate runs p on the engine (traced) and bounds its wait for the first token by p.due:
// past it, the engine's request is cancelled (its context, which an engine's stream lives
// in) and Generate or Recv returns a *firstTokenLate. A request already past its deadline
// does not reach the engine.
func (n *Node) generate(ctx context.Context, p *prepared) (engine.Stream, error) {
	if p.due.IsZero() {
		return n.traced(ctx, p)
	}
	late := &firstTokenLate{ttl: p.ttl, prefill: p.req.PrefillOnly}
	wait := time.Until(p.due)
	if wait <= 0 {
		return nil, late
	}
	ctx, cancel := context.WithCancelCause(ctx)
	s := &boundedStream{late: late, cancel: cancel}
	s.timer = time.AfterFunc(wait, func() {
		if s.state.CompareAndSwap(awaitingFirst, firstLate) {
			n.log.Info("no first token within the queue TTL: engine request cancelled", "id", p.req.ID, "ttl", p.ttl,
				"prefill", p.req.PrefillOnly)
			cancel(late)
		}
	})
	st, err := n.traced(ctx, p)
	if err != nil {
		s.timer.Stop()
		cancel(nil)
		if s.state.Load() == firstLate {
			return nil, late
		}
		return nil, err
	}
	s.Stream = st
	return s, nil
}

// The states of a boundedStream.
const (
	awaitingFirst int32 = iota
	firstCame           // the bound no longer applies
	firstLate           // the deadline passed first: the engine's request is cancelled
)

// boundedStream is a generation whose first token is due by a deadline (generate).
type boundedStream struct {
	engine.Stream
	late   *firstTokenLate
	cancel context.CancelCauseFunc
	timer  *time.Timer
	state  atomic.Int32
}

func (s *boundedStream) Recv() (engine.Chunk, error) {
	c, err := s.Stream.Recv()
	switch {
	case s.state.Load() == firstCame:
	case err == nil && s.state.CompareAndSwap(awaitingFirst, firstCame):
		s.timer.Stop()
	case s.state.Load() == firstLate:
		return engine.Chunk{}, s.late // what the engine made of the cancellation, or a chunk just too late
	}
	return c, err
}

// Close ends the generation and releases its context.
func (s *boundedStream) Close() error {
	s.timer.Stop()
	err := s.Stream.Close()
	s.cancel(nil)
	return err
}

// renewDue gives a request about to run again after a failed attempt its queue TTL afresh,
// once, when that attempt ended past its deadline (attempt.Renew): the failed owner's engine
// had given the first token (else the owner would have ended the request with 504
// engine_timeout), or the owner went silent.
func (n *Node) renewDue(p *prepared) {
	p.due, p.renewed = attempt.Renew(time.Now(), p.due, p.ttl, p.renewed)
}
