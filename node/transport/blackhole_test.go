package transport

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// relay forwards UDP between one client and target until cut, after which it silently drops
// everything: a peer that vanished without closing anything (power loss, partition).
type relay struct {
	front, back *net.UDPConn
	cut         atomic.Bool
	client      atomic.Pointer[net.UDPAddr]
	// droppedLarge counts the client's packets of over 512 bytes dropped while cut: ones that
	// carry a forward's body, not acknowledgements or pings.
	droppedLarge atomic.Int64
	wg           sync.WaitGroup
}

func newRelay(t *testing.T, target string) *relay {
	t.Helper()
	front, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	ta, err := net.ResolveUDPAddr("udp", target)
	if err != nil {
		t.Fatal(err)
	}
	back, err := net.DialUDP("udp", nil, ta)
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{front: front, back: back}
	r.wg.Add(2)
	go func() {
		defer r.wg.Done()
		buf := make([]byte, 2048)
		for {
			n, from, err := front.ReadFromUDP(buf)
			if err != nil {
				return
			}
			r.client.Store(from)
			switch {
			case !r.cut.Load():
				_, _ = back.Write(buf[:n])
			case n > 512:
				r.droppedLarge.Add(1)
			}
		}
	}()
	go func() {
		defer r.wg.Done()
		buf := make([]byte, 2048)
		for {
			n, err := back.Read(buf)
			if err != nil {
				return
			}
			if c := r.client.Load(); c != nil && !r.cut.Load() {
				_, _ = front.WriteToUDP(buf[:n], c)
			}
		}
	}()
	t.Cleanup(func() { _ = front.Close(); _ = back.Close(); r.wg.Wait() })
	return r
}

func TestVanishedOwnerIsDetected(t *testing.T) {
	started := make(chan struct{})
	ownerCtx := make(chan error, 1)
	client, server := pair(t, HandlerFunc(func(ctx context.Context, _ Header, _ []byte, w ResponseWriter) {
		_, _ = w.Write([]byte("partial"))
		close(started)
		<-ctx.Done()
		ownerCtx <- ctx.Err()
	}))
	r := newRelay(t, server.addr())
	resp, err := client.tr.Forward(testCtx(t), r.front.LocalAddr().String(), Header{RequestID: "v"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	<-started
	buf := make([]byte, 7)
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		t.Fatal(err)
	}
	r.cut.Store(true)
	// readAll fails the test if this hangs; the idle timeout (1 s here) must end it.
	data, err := readAll(t, resp.Body)
	if !errors.Is(err, ErrTruncated) || len(data) != 0 {
		t.Fatalf("after the owner vanished: %q, %v; want ErrTruncated", data, err)
	}
	// The owner in turn stops hearing the ingress and cancels the work.
	select {
	case <-ownerCtx:
	case <-time.After(5 * time.Second):
		t.Fatal("owner's context survived a vanished ingress")
	}
}

// TestVanishedOwnerEndsForwardWithinIdleTimeout pins the bound on a forward caught on a peer
// that vanished without closing anything: whether it still waits for the owner's answer or
// already reads its response, it ends, as unreachable or truncated, by the idle timeout (the
// test's, 1 s; one still waiting for its answer then redials once, for the handshake timeout)
// and not by some later timer; TestDefaultDeadPeerBound pins the defaults.
func TestVanishedOwnerEndsForwardWithinIdleTimeout(t *testing.T) {
	for _, tt := range []struct {
		name   string
		accept bool // the owner answered before it vanished
		want   error
	}{
		{"before the answer", false, ErrUnreachable},
		{"mid-response", true, ErrTruncated},
	} {
		t.Run(tt.name, func(t *testing.T) {
			started := make(chan struct{})
			client, server := pair(t, HandlerFunc(func(ctx context.Context, _ Header, _ []byte, w ResponseWriter) {
				if tt.accept {
					_, _ = w.Write([]byte("partial"))
				}
				close(started)
				<-ctx.Done()
			}))
			r := newRelay(t, server.addr())
			addr := r.front.LocalAddr().String()
			var resp *Response
			if tt.accept {
				// The client has read the start of the response when the owner vanishes.
				var err error
				if resp, err = client.tr.Forward(testCtx(t), addr, Header{RequestID: "v"}, nil); err != nil {
					t.Fatal(err)
				}
				if _, err := io.ReadFull(resp.Body, make([]byte, 7)); err != nil {
					t.Fatal(err)
				}
			}
			done := make(chan error, 1)
			go func() {
				if resp == nil {
					var err error
					if resp, err = client.tr.Forward(testCtx(t), addr, Header{RequestID: "v"}, nil); err != nil {
						done <- err
						return
					}
				}
				defer resp.Body.Close()
				_, err := io.Copy(io.Discard, resp.Body)
				done <- err
			}()
			<-started
			cut := time.Now()
			r.cut.Store(true)
			// The idle timeout ends it; no timing is asserted beyond the hang guard.
			select {
			case err := <-done:
				t.Logf("the forward ended %v after the owner vanished (idle timeout %v)", time.Since(cut), client.tr.cfg.IdleTimeout)
				if !errors.Is(err, tt.want) {
					t.Errorf("the forward ended with %v, want %v", err, tt.want)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the forward to a vanished owner hung")
			}
		})
	}
}

// TestDefaultDeadPeerBound pins the production defaults behind that bound: a forward caught on
// a vanished peer ends within KeepAlive + IdleTimeout, 4 s, with pings well inside the idle
// timeout, so that a live peer's silence never reaches it.
func TestDefaultDeadPeerBound(t *testing.T) {
	d := DefaultConfig()
	if bound := d.KeepAlive + d.IdleTimeout; bound > 4*time.Second {
		t.Errorf("a forward to a vanished peer may wait %v (keep-alive %v + idle timeout %v), want at most 4s", bound, d.KeepAlive, d.IdleTimeout)
	}
	if d.KeepAlive*3 > d.IdleTimeout {
		t.Errorf("keep-alive %v is not well under the idle timeout %v: a lost ping or two would end a live connection", d.KeepAlive, d.IdleTimeout)
	}
}
