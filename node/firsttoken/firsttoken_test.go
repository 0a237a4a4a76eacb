package firsttoken

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvmesh/kvmesh/node/engine"
)

// fake is an engine's stream: its chunks come on ch; cancelled, it ends with its context's
// cause.
type fake struct {
	ctx    context.Context
	ch     chan engine.Chunk
	closed bool
}

func (f *fake) Recv() (engine.Chunk, error) {
	select {
	case c := <-f.ch:
		return c, nil
	case <-f.ctx.Done():
		return engine.Chunk{}, context.Cause(f.ctx)
	}
}

func (f *fake) Close() error { f.closed = true; return nil }

// TestBound pins the first-token bound: past the deadline before the first token, the
// engine's request is cancelled and the generation ends with Late; a first token in time
// lifts the bound; a generation already late is not opened.
func TestBound(t *testing.T) {
	late := &Late{TTL: time.Second}
	t.Run("already late", func(t *testing.T) {
		opened := false
		_, err := Bound(t.Context(), time.Now().Add(-time.Millisecond), late,
			func(context.Context) (engine.Stream, error) { opened = true; return nil, nil }, func() {})
		if err != late || opened {
			t.Errorf("err %v opened %v, want Late without opening", err, opened)
		}
	})
	t.Run("no first token by the deadline", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := &fake{ch: make(chan engine.Chunk)}
			cancelled := 0
			st, err := Bound(t.Context(), time.Now().Add(time.Second), late,
				func(ctx context.Context) (engine.Stream, error) { f.ctx = ctx; return f, nil }, func() { cancelled++ })
			if err != nil {
				t.Fatal(err)
			}
			_, err = st.Recv()
			var l *Late
			if !errors.As(err, &l) || cancelled != 1 || f.ctx.Err() == nil {
				t.Errorf("err %v, cancelled %d, engine's context %v; want Late, once, cancelled", err, cancelled, f.ctx.Err())
			}
			_ = st.Close()
			if !f.closed {
				t.Error("engine's stream not closed")
			}
		})
	})
	t.Run("first token in time", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := &fake{ch: make(chan engine.Chunk, 2)}
			cancelled := 0
			st, _ := Bound(t.Context(), time.Now().Add(time.Second), late,
				func(ctx context.Context) (engine.Stream, error) { f.ctx = ctx; return f, nil }, func() { cancelled++ })
			f.ch <- engine.Chunk{Text: "a"}
			if c, err := st.Recv(); err != nil || c.Text != "a" {
				t.Fatalf("%v %v", c, err)
			}
			time.Sleep(2 * time.Second) // synctest's clock: past the deadline
			f.ch <- engine.Chunk{Text: "b"}
			if c, err := st.Recv(); err != nil || c.Text != "b" || cancelled != 0 {
				t.Errorf("%v %v cancelled %d: the bound should no longer apply", c, err, cancelled)
			}
			_ = st.Close()
		})
	})
	t.Run("open fails", func(t *testing.T) {
		boom := errors.New("boom")
		_, err := Bound(t.Context(), time.Now().Add(time.Hour), late,
			func(context.Context) (engine.Stream, error) { return nil, boom }, func() {})
		if err != boom {
			t.Errorf("err %v, want the engine's", err)
		}
	})
}
