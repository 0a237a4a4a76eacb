package transport

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/quic-go/quic-go"

	"github.com/kvmesh/kvmesh/internal/poll"
)

// TestForwardRedialsDeadPooledConnection pins that a forward sent on a pooled connection that
// the owner no longer has, while this side has not seen it end, is sent once more on a new
// connection and succeeds: the owner restarted (its stateless reset answers the forward) or
// closed the connection, and the news was lost (here a relay drops it; a host frozen past the
// idle timeout never reads it). The forward counts no unreachable stream, so the node counts
// no failed attempt and ejects no one.
func TestForwardRedialsDeadPooledConnection(t *testing.T) {
	for _, tt := range []struct {
		name string
		// kill makes the owner forget the pooled connection while the relay drops everything.
		kill func(t *testing.T, server *node, restart func())
	}{
		{"owner restarted", func(t *testing.T, server *node, restart func()) {
			if err := server.tr.Close(); err != nil {
				t.Fatal(err)
			}
			restart()
		}},
		{"owner closed the connection", func(t *testing.T, server *node, _ func()) {
			server.tr.mu.Lock()
			defer server.tr.mu.Unlock()
			for c := range server.tr.conns {
				_ = c.CloseWithError(0x42, "gone")
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := pki(t, "a", "b")
			var calls atomic.Int64
			echo := HandlerFunc(func(_ context.Context, _ Header, b []byte, w ResponseWriter) {
				calls.Add(1)
				_, _ = w.Write(b)
			})
			// Timers long enough that no ping or idle timeout reveals the dead connection
			// before the forward does.
			config := func(name, addr string, h Handler) Config {
				cfg := testConfig(t, loadTLS(t, dir, name), addr, h)
				cfg.KeepAlive, cfg.IdleTimeout = 10*time.Second, 20*time.Second
				return cfg
			}
			server := startNodeConfig(t, config("b", "127.0.0.1:0", echo))
			client := startNodeConfig(t, config("a", "127.0.0.1:0", nil))
			r := newRelay(t, server.addr())
			addr := r.front.LocalAddr().String()
			forward := func(msg []byte) error {
				resp, err := client.tr.Forward(testCtx(t), addr, Header{RequestID: "r"}, msg)
				if err != nil {
					return err
				}
				defer resp.Body.Close()
				data, err := readAll(t, resp.Body)
				if err == nil && !bytes.Equal(data, msg) {
					err = errors.New("the echo differs from the body sent")
				}
				return err
			}
			if err := forward([]byte("warm")); err != nil {
				t.Fatal(err)
			}

			r.cut.Store(true)
			tt.kill(t, server, func() { startNodeConfig(t, config("b", server.addr(), echo)) })
			// The forward goes out on the pooled connection and is lost until the relay
			// resumes; it then meets the owner's reset or close.
			done := make(chan error, 1)
			go func() { done <- forward(bytes.Repeat([]byte("x"), 2000)) }()
			poll.Until(t, 5*time.Second, "the forward to be sent on the pooled connection", func() bool { return r.droppedLarge.Load() > 0 })
			r.cut.Store(false)
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("forward on a dead pooled connection: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("forward on a dead pooled connection hung")
			}
			if got := testutil.ToFloat64(client.tr.m.redials); got != 1 {
				t.Errorf("redials = %v, want 1", got)
			}
			if got := testutil.ToFloat64(client.tr.m.streams.WithLabelValues(dirOut, resultUnreachable)); got != 0 {
				t.Errorf("unreachable streams = %v, want 0", got)
			}
			if got := testutil.ToFloat64(client.tr.m.streams.WithLabelValues(dirOut, resultAccepted)); got != 2 {
				t.Errorf("accepted streams = %v, want 2", got)
			}
			if got := calls.Load(); got != 2 {
				t.Errorf("the owner ran %d requests, want 2 (the warm-up and the redialled one)", got)
			}
		})
	}
}

// TestDeadConnErrors pins which stream failures show the connection dead (and so are sent
// again on a new one) and which are the owner's answer on a live connection.
func TestDeadConnErrors(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"idle timeout", &quic.IdleTimeoutError{}, true},
		{"stateless reset", &quic.StatelessResetError{}, true},
		{"closed by the peer", &quic.ApplicationError{Remote: true, ErrorCode: codeShutdown}, true},
		{"closed by this side", &quic.ApplicationError{ErrorCode: codeShutdown}, false},
		{"stream reset by the owner", &quic.StreamError{Remote: true, ErrorCode: codeProtocol}, false},
		{"malformed answer", ErrMalformed, false},
		{"truncated answer", io.ErrUnexpectedEOF, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := connClosed(errors.Join(ErrUnreachable, tt.err)); got != tt.want {
				t.Errorf("connClosed(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}
