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
	wg          sync.WaitGroup
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
			if !r.cut.Load() {
				_, _ = back.Write(buf[:n])
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
