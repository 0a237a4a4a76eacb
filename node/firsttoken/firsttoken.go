package firsttoken

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/node/engine"
)

// Late is the error of a generation whose first token (a prefill's handover) did not come
// within its request's queue TTL.
type Late struct {
	TTL     time.Duration
	Prefill bool
}

func (e *Late) Error() string {
	if e.Prefill {
		return fmt.Sprintf("no handover within the queue TTL (%v): the prefill engine's queue did not reach the request", e.TTL)
	}
	return fmt.Sprintf("no first token within the queue TTL (%v): the engine's queue did not reach the request", e.TTL)
}

// Bound opens a generation (open, given the context the engine's stream lives in) whose first
// token is due by due: past it, that context is cancelled, cancelled is called (once), and
// open or Recv returns late. A generation already past its deadline is not opened.
func Bound(ctx context.Context, due time.Time, late *Late, open func(context.Context) (engine.Stream, error), cancelled func()) (engine.Stream, error) {
	wait := time.Until(due)
	if wait <= 0 {
		return nil, late
	}
	ctx, cancel := context.WithCancelCause(ctx)
	s := &stream{late: late, cancel: cancel}
	s.timer = time.AfterFunc(wait, func() {
		if s.state.CompareAndSwap(awaitingFirst, firstLate) {
			cancelled()
			cancel(late)
		}
	})
	st, err := open(ctx)
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

// The states of a stream.
const (
	awaitingFirst int32 = iota
	firstCame           // the bound no longer applies
	firstLate           // the deadline passed first: the engine's request is cancelled
)

// stream is a generation whose first token is due by a deadline (Bound).
type stream struct {
	engine.Stream
	late   *Late
	cancel context.CancelCauseFunc
	timer  *time.Timer
	state  atomic.Int32
}

func (s *stream) Recv() (engine.Chunk, error) {
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
func (s *stream) Close() error {
	s.timer.Stop()
	err := s.Stream.Close()
	s.cancel(nil)
	return err
}
