package transport

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/quic-go/quic-go"

	"github.com/kvmesh/kvmesh/internal/poll"
)

func pair(t *testing.T, h Handler) (client, server *node) {
	t.Helper()
	dir := pki(t, "a", "b")
	server = startNode(t, loadTLS(t, dir, "b"), "127.0.0.1:0", h)
	client = startNode(t, loadTLS(t, dir, "a"), "127.0.0.1:0", nil)
	return client, server
}

func TestForwardRoundTrip(t *testing.T) {
	want := Header{
		Version:    Version,
		RequestID:  "req-1",
		Hops:       1,
		Priority:   -2,
		Tenant:     "acme",
		Deadline:   time.Unix(1700000000, 123456789),
		AgentID:    "agent-7",
		Blocks:     []uint64{1, 2, 1 << 63},
		Ingress:    "a",
		Kind:       KindRequest,
		Endpoint:   EndpointCompletions,
		Waited:     1234 * time.Microsecond,
		TTFTSLO:    2 * time.Second,
		TPOTSLO:    150 * time.Millisecond,
		AgentFinal: true,
		// The owner continues the ingress's trace.
		TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		TraceState:  "rojo=00f067aa0ba902b7",
	}
	type seen struct {
		h    Header
		body []byte
	}
	saw := make(chan seen, 1)
	rec := &recorder{serve: func(_ context.Context, h Header, body []byte, w ResponseWriter) {
		select { // never block the owner: a failed subtest leaves its value unread
		case saw <- seen{h, body}:
		default:
		}
		if err := w.Accept(http.StatusOK, map[string]string{"Content-Type": "text/event-stream"}); err != nil {
			t.Errorf("Accept: %v", err)
		}
		_, _ = w.Write([]byte("hello "))
		_, _ = w.Write(body)
	}}
	client, server := pair(t, rec)
	for _, size := range []int{0, 100, 200 << 10} { // empty, inline, and a body written separately
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			body := bytes.Repeat([]byte{'x'}, size)
			resp, err := client.tr.Forward(testCtx(t), server.addr(), want, body)
			if err != nil {
				t.Fatalf("Forward: %v", err)
			}
			defer resp.Body.Close()
			if resp.Status != 200 || resp.Headers["Content-Type"] != "text/event-stream" {
				t.Errorf("status %d headers %v", resp.Status, resp.Headers)
			}
			data, err := readAll(t, resp.Body)
			if err != nil {
				t.Fatalf("body: %v", err)
			}
			if !bytes.Equal(data, append([]byte("hello "), body...)) {
				t.Errorf("body of %d bytes, want %d", len(data), 6+len(body))
			}
			var got seen
			select {
			case got = <-saw:
			default:
				t.Fatal("handler did not run")
			}
			if !reflect.DeepEqual(got.h, want) || !bytes.Equal(got.body, body) {
				t.Errorf("owner saw %+v (%d bytes), want %+v", got.h, len(got.body), want)
			}
		})
	}
}

func TestRefusalCarriesState(t *testing.T) {
	want := Refusal{Status: 429, Code: "queue_full", Message: "too many", RetryAfter: 1500 * time.Millisecond, State: []byte{0, 1, 2, 0xff}}
	client, server := pair(t, HandlerFunc(func(_ context.Context, _ Header, _ []byte, w ResponseWriter) {
		if err := w.Refuse(want); err != nil {
			t.Errorf("Refuse: %v", err)
		}
		if err := w.Accept(200, nil); !errors.Is(err, ErrAnswered) {
			t.Errorf("Accept after Refuse: %v, want ErrAnswered", err)
		}
		if _, err := w.Write([]byte("x")); !errors.Is(err, ErrAnswered) {
			t.Errorf("Write after Refuse: %v, want ErrAnswered", err)
		}
	}))
	resp, err := client.tr.Forward(testCtx(t), server.addr(), Header{RequestID: "r"}, nil)
	var r *Refusal
	if !errors.As(err, &r) {
		t.Fatalf("Forward = %v, %v; want a *Refusal", resp, err)
	}
	if !reflect.DeepEqual(*r, want) {
		t.Errorf("refusal %+v, want %+v", *r, want)
	}
	if isUnreachable(err) {
		t.Errorf("a refusal must not look unreachable")
	}
	if got := testutil.ToFloat64(client.tr.m.streams.WithLabelValues(dirOut, resultRefused)); got != 1 {
		t.Errorf("out refused streams = %v, want 1", got)
	}
}

func TestOwnerAnswers(t *testing.T) {
	tests := []struct {
		name    string
		serve   func(w ResponseWriter)
		refusal string // expected refusal code, or "" for an accepted response
		body    string
		bodyErr error
	}{
		{"fail mid-stream", func(w ResponseWriter) { _, _ = w.Write([]byte("part")); _ = w.Fail(errors.New("engine crashed")) }, "", "part", ErrRemote},
		{"fail before accept", func(w ResponseWriter) { _ = w.Fail(errors.New("engine down")) }, "owner_failed", "", nil},
		{"no answer", func(ResponseWriter) {}, "no_response", "", nil},
		{"panic", func(w ResponseWriter) { _, _ = w.Write([]byte("p")); panic("boom") }, "", "p", ErrRemote},
		{"accept only", func(w ResponseWriter) { _ = w.Accept(204, nil) }, "", "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client, server := pair(t, HandlerFunc(func(_ context.Context, _ Header, _ []byte, w ResponseWriter) { tt.serve(w) }))
			resp, err := client.tr.Forward(testCtx(t), server.addr(), Header{RequestID: "r"}, nil)
			if tt.refusal != "" {
				var r *Refusal
				if !errors.As(err, &r) || r.Code != tt.refusal || r.Status != 502 {
					t.Fatalf("Forward error %v, want refusal %s", err, tt.refusal)
				}
				return
			}
			if err != nil {
				t.Fatalf("Forward: %v", err)
			}
			defer resp.Body.Close()
			data, err := readAll(t, resp.Body)
			if string(data) != tt.body {
				t.Errorf("body %q, want %q", data, tt.body)
			}
			if tt.bodyErr == nil && err != nil || tt.bodyErr != nil && !errors.Is(err, tt.bodyErr) {
				t.Errorf("body error %v, want %v", err, tt.bodyErr)
			}
		})
	}
}

func TestStreamingRelaysChunkByChunk(t *testing.T) {
	next := make(chan struct{})
	client, server := pair(t, HandlerFunc(func(ctx context.Context, _ Header, _ []byte, w ResponseWriter) {
		for i := range 3 {
			if _, err := fmt.Fprintf(w, "chunk%d;", i); err != nil {
				return
			}
			// The next chunk is only written once the client has seen this one: if anything
			// buffered the response, the client would never see it and the test would time out.
			select {
			case <-next:
			case <-ctx.Done():
				return
			}
		}
	}))
	resp, err := client.tr.Forward(testCtx(t), server.addr(), Header{RequestID: "s"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	for i := range 3 {
		want := fmt.Sprintf("chunk%d;", i)
		buf := make([]byte, len(want))
		done := make(chan error, 1)
		go func() { _, err := io.ReadFull(resp.Body, buf); done <- err }()
		select {
		case err := <-done:
			if err != nil || string(buf) != want {
				t.Fatalf("chunk %d = %q, %v; want %q", i, buf, err, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("chunk %d never arrived: the relay buffers", i)
		}
		next <- struct{}{}
	}
	if data, err := readAll(t, resp.Body); err != nil || len(data) != 0 {
		t.Errorf("after the chunks: %q, %v; want clean EOF", data, err)
	}
}

func TestClientCancelCancelsOwner(t *testing.T) {
	tests := []struct {
		name   string
		accept bool                                // owner accepts and writes before blocking
		cancel func(cancel func(), resp *Response) // how the client gives up
	}{
		{"close body", true, func(_ func(), r *Response) { _ = r.Body.Close() }},
		{"cancel ctx while streaming", true, func(c func(), _ *Response) { c() }},
		{"cancel ctx before the answer", false, func(c func(), _ *Response) { c() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			started := make(chan struct{})
			ownerDone := make(chan error, 1)
			client, server := pair(t, HandlerFunc(func(ctx context.Context, _ Header, _ []byte, w ResponseWriter) {
				if tt.accept {
					_, _ = w.Write([]byte("first"))
				}
				close(started)
				<-ctx.Done()
				ownerDone <- ctx.Err()
			}))
			ctx, cancel := context.WithCancel(testCtx(t))
			defer cancel()
			type res struct {
				resp *Response
				err  error
			}
			fwd := make(chan res, 1)
			go func() {
				resp, err := client.tr.Forward(ctx, server.addr(), Header{RequestID: "c"}, nil)
				fwd <- res{resp, err}
			}()
			<-started
			var resp *Response
			if tt.accept {
				r := <-fwd
				if r.err != nil {
					t.Fatal(r.err)
				}
				resp = r.resp
				buf := make([]byte, 5)
				if _, err := io.ReadFull(resp.Body, buf); err != nil {
					t.Fatal(err)
				}
			}
			tt.cancel(cancel, resp)
			select {
			case err := <-ownerDone:
				if err == nil {
					t.Errorf("owner ctx not cancelled")
				}
			case <-time.After(5 * time.Second):
				t.Fatal("owner's context was not cancelled")
			}
			if !tt.accept {
				r := <-fwd
				if !errors.Is(r.err, context.Canceled) || isUnreachable(r.err) {
					t.Errorf("Forward after cancel = %v, want context.Canceled", r.err)
				}
			} else if _, err := resp.Body.Read(make([]byte, 1)); err == nil {
				t.Errorf("Read after cancel succeeded")
			}
		})
	}
}

func TestOwnerClosedMidStreamTruncates(t *testing.T) {
	started := make(chan struct{})
	client, server := pair(t, HandlerFunc(func(ctx context.Context, _ Header, _ []byte, w ResponseWriter) {
		_, _ = w.Write([]byte("partial"))
		close(started)
		<-ctx.Done()
	}))
	resp, err := client.tr.Forward(testCtx(t), server.addr(), Header{RequestID: "k"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	<-started
	buf := make([]byte, 7)
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		t.Fatal(err)
	}
	if err := server.tr.Close(); err != nil {
		t.Fatalf("server Close: %v", err)
	}
	if err := server.tr.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	data, err := readAll(t, resp.Body)
	if !errors.Is(err, ErrTruncated) || len(data) != 0 {
		t.Fatalf("after the owner died: %q, %v; want ErrTruncated", data, err)
	}
}

// fakeOwner serves raw QUIC streams with a given script, for answers the real writer never
// produces: a stream that ends without its end frame, garbage before the answer.
func fakeOwner(t *testing.T, dir string, script func(str *quic.Stream)) string {
	t.Helper()
	ln, err := quic.ListenAddr("127.0.0.1:0", loadTLS(t, dir, "b"), &quic.Config{MaxIdleTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); _ = ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := ln.Accept(ctx)
		if err != nil {
			return
		}
		defer c.CloseWithError(0, "")
		str, err := c.AcceptStream(ctx)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, str)
		script(str)
		<-ctx.Done()
	}()
	return ln.Addr().String()
}

func TestMisbehavingOwner(t *testing.T) {
	accept, _ := encodeAccept(200, nil)
	frame := func(typ byte, p []byte) []byte { return append(appendFrameHead(nil, typ, len(p)), p...) }
	tests := []struct {
		name      string
		wire      []byte
		forwardOK bool
		want      error
	}{
		{"fin without end frame", append(frame(frameAccept, accept), frame(frameData, []byte("ab"))...), true, ErrTruncated},
		{"fin inside a data frame", append(frame(frameAccept, accept), frame(frameData, []byte("abcd"))[:4]...), true, ErrTruncated},
		{"unknown frame after accept", append(frame(frameAccept, accept), 0x7f, 0), true, ErrTruncated},
		{"data before the answer", frame(frameData, []byte("x")), false, ErrUnreachable},
		{"fin before the answer", nil, false, ErrUnreachable},
		{"bad accept", frame(frameAccept, []byte{0xff}), false, ErrUnreachable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := pki(t, "a", "b")
			addr := fakeOwner(t, dir, func(str *quic.Stream) { _, _ = str.Write(tt.wire); _ = str.Close() })
			client := startNode(t, loadTLS(t, dir, "a"), "127.0.0.1:0", nil)
			resp, err := client.tr.Forward(testCtx(t), addr, Header{RequestID: "m"}, nil)
			if !tt.forwardOK {
				if !errors.Is(err, tt.want) {
					t.Fatalf("Forward = %v, want %v", err, tt.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if _, err := readAll(t, resp.Body); !errors.Is(err, tt.want) {
				t.Fatalf("body error %v, want %v", err, tt.want)
			}
		})
	}
}

func TestDialDeadAddressIsUnreachable(t *testing.T) {
	dir := pki(t, "a")
	client := startNode(t, loadTLS(t, dir, "a"), "127.0.0.1:0", nil)
	for addr, reason := range map[string]string{deadAddr(t): FailTimeout, "not an address": FailHandshake} {
		_, err := client.tr.Forward(testCtx(t), addr, Header{RequestID: "d"}, nil)
		if !isUnreachable(err) {
			t.Errorf("Forward(%q) = %v, want ErrUnreachable", addr, err)
		}
		if got := FailureReason(err); got != reason {
			t.Errorf("Forward(%q) failed for %q (%v), want %q", addr, got, err, reason)
		}
	}
	if got := testutil.ToFloat64(client.tr.m.dialErrors); got != 2 {
		t.Errorf("dial errors = %v, want 2", got)
	}
}

func TestForeignCertificatesAreRefused(t *testing.T) {
	home, foreign := pki(t, "a", "b"), pki(t, "a", "b")
	tests := []struct {
		name             string
		serverDir, clDir string
	}{
		{"client from another CA", home, foreign},
		{"server from another CA", foreign, home},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recorder{}
			server := startNode(t, loadTLS(t, tt.serverDir, "b"), "127.0.0.1:0", rec)
			client := startNode(t, loadTLS(t, tt.clDir, "a"), "127.0.0.1:0", nil)
			_, err := client.tr.Forward(testCtx(t), server.addr(), Header{RequestID: "x"}, []byte("{}"))
			if !isUnreachable(err) {
				t.Fatalf("Forward = %v, want ErrUnreachable", err)
			}
			if got := FailureReason(err); got != FailTLS {
				t.Errorf("failed for %q (%v), want %q", got, err, FailTLS)
			}
			poll.Until(t, 5*time.Second, "the failed handshake to be counted", func() bool { return server.rejected(reasonHandshake) >= 1 })
			if rec.n() != 0 {
				t.Errorf("handler ran %d times for a foreign peer", rec.n())
			}
		})
	}
}

func TestHandshakeWithoutClusterIdentityIsRefused(t *testing.T) {
	dir := pki(t, "a", "b")
	rec := &recorder{}
	server := startNode(t, loadTLS(t, dir, "b"), "127.0.0.1:0", rec)
	good := loadTLS(t, dir, "a")
	noCert := good.Clone()
	noCert.Certificates = nil
	wrongALPN := good.Clone()
	wrongALPN.NextProtos = []string{"h3"}
	tests := []struct {
		name string
		conf func() *tls.Config
	}{
		{"no client certificate", func() *tls.Config { return noCert }},
		{"wrong alpn", func() *tls.Config { return wrongALPN }},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := rawForward(t, server.addr(), tt.conf()); err == nil {
				t.Fatal("a stream was served")
			}
			poll.Until(t, 5*time.Second, "the refused handshake to be counted", func() bool { return server.rejected(reasonHandshake) >= float64(i+1) })
		})
	}
	if rec.n() != 0 {
		t.Errorf("handler ran %d times", rec.n())
	}
}

// rawForward dials with conf and sends a well-formed request; nil means an answer came back.
func rawForward(t *testing.T, addr string, conf *tls.Config) error {
	t.Helper()
	ctx := testCtx(t)
	c, err := quic.DialAddr(ctx, addr, conf, &quic.Config{HandshakeIdleTimeout: time.Second, MaxIdleTimeout: time.Second})
	if err != nil {
		return err
	}
	defer c.CloseWithError(0, "")
	str, err := c.OpenStreamSync(ctx)
	if err != nil {
		return err
	}
	hdr, _ := EncodeHeader(nil, Header{RequestID: "raw"})
	msg := append(appendFrameHead(nil, frameHeader, len(hdr)), hdr...)
	msg = appendFrameHead(msg, frameBody, 0)
	if _, err := str.Write(msg); err != nil {
		return err
	}
	_ = str.Close()
	_, err = str.Read(make([]byte, 1))
	return err
}

func TestInsecureConfigIsRefused(t *testing.T) {
	dir := pki(t, "a")
	conf := loadTLS(t, dir, "a")
	conf.InsecureSkipVerify = true
	if _, err := New(testConfig(t, conf, "127.0.0.1:0", nil)); err == nil {
		t.Fatal("New accepted a config that skips peer verification")
	}
}

func TestGarbageIsDroppedAndCounted(t *testing.T) {
	client, server := pair(t, HandlerFunc(func(_ context.Context, _ Header, body []byte, w ResponseWriter) {
		_, _ = w.Write(body)
	}))
	check := func(t *testing.T) {
		t.Helper()
		resp, err := client.tr.Forward(testCtx(t), server.addr(), Header{RequestID: "ok"}, []byte("alive"))
		if err != nil {
			t.Fatalf("server stopped serving: %v", err)
		}
		defer resp.Body.Close()
		if data, err := readAll(t, resp.Body); err != nil || string(data) != "alive" {
			t.Fatalf("body %q, %v", data, err)
		}
	}

	t.Run("datagrams", func(t *testing.T) {
		u, err := net.Dial("udp", server.addr())
		if err != nil {
			t.Fatal(err)
		}
		defer u.Close()
		junk := make([]byte, 1300)
		for i := range 20 {
			_, _ = rand.Read(junk)
			if i%2 == 0 {
				junk[0] &^= 0xc0 // short header without the fixed bit: not QUIC at all
			} else {
				junk[0] |= 0xc0 // looks like a long header: quic-go parses and drops it
			}
			if _, err := u.Write(junk); err != nil {
				t.Fatal(err)
			}
		}
		// Loopback UDP can drop under load: each poll that finds fewer than five counted
		// sends one more, so a loss delays the test rather than failing it.
		poll.Until(t, 10*time.Second, "non-QUIC datagrams to be counted", func() bool {
			if server.rejected(reasonNotQUIC) >= 5 {
				return true
			}
			_, _ = rand.Read(junk)
			junk[0] &^= 0xc0
			_, _ = u.Write(junk)
			return false
		})
		check(t)
	})

	tests := []struct {
		name   string
		wire   []byte
		reason string
	}{
		{"not a frame", []byte("GET / HTTP/1.1\r\n\r\n"), reasonHeader},
		{"header frame with garbage", append(appendFrameHead(nil, frameHeader, 3), Version, 0, 0xff), reasonHeader},
		{"oversized header", appendFrameHead(nil, frameHeader, MaxHeaderBytes+1), reasonHeader},
		{"missing body", validHeaderFrame(), reasonBody},
		{"data after body", append(appendFrameHead(validHeaderFrame(), frameBody, 0), 7), reasonBody},
		{"oversized body", appendFrameHead(validHeaderFrame(), frameBody, 16<<20+1), reasonBody},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := server.rejected(tt.reason)
			err := rawStream(t, server.addr(), client.tr.clientTLS, tt.wire)
			var se *quic.StreamError
			if !errors.As(err, &se) || se.ErrorCode != codeProtocol {
				t.Errorf("stream ended with %v, want a protocol reset", err)
			}
			if got := server.rejected(tt.reason); got != before+1 {
				t.Errorf("rejected{%s} = %v, want %v", tt.reason, got, before+1)
			}
			check(t)
		})
	}
}

// TestForwardAgentKinds sends the agent-lease kinds over a real stream: the owner's handler
// sees each header as sent, with its typed fields, and its accept headers come back.
func TestForwardAgentKinds(t *testing.T) {
	saw := make(chan Header, 1)
	client, server := pair(t, HandlerFunc(func(_ context.Context, h Header, body []byte, w ResponseWriter) {
		select {
		case saw <- h:
		default:
		}
		if len(body) != 0 {
			t.Errorf("%v body of %d bytes", h.Kind, len(body))
		}
		_ = w.Accept(http.StatusOK, map[string]string{"X-Kind": h.Kind.String()})
	}))
	for _, want := range []Header{
		{Version: Version, Kind: KindAgentRenew, RequestID: "h", Hops: 1, Priority: 2, Tenant: "t", AgentID: "a", Ingress: "in", RenewWait: 750 * time.Millisecond},
		{Version: Version, Kind: KindAgentGiveUp, RequestID: "g", Hops: 1, AgentID: "a", Ingress: "in"},
	} {
		t.Run(want.Kind.String(), func(t *testing.T) {
			resp, err := client.tr.Forward(testCtx(t), server.addr(), want, nil)
			if err != nil {
				t.Fatalf("Forward: %v", err)
			}
			defer resp.Body.Close()
			if _, err := readAll(t, resp.Body); err != nil {
				t.Fatalf("body: %v", err)
			}
			if resp.Headers["X-Kind"] != want.Kind.String() {
				t.Errorf("accept headers %v, want X-Kind %s", resp.Headers, want.Kind)
			}
			select {
			case got := <-saw:
				if !reflect.DeepEqual(got, want) {
					t.Errorf("owner saw %+v, want %+v", got, want)
				}
			default:
				t.Fatal("handler did not run")
			}
		})
	}
}

// TestUnreadableHeaderIsRefused pins how an owner answers a header of another frame version
// or of a kind it does not know: a refusal any version can read, never a handler call.
func TestUnreadableHeaderIsRefused(t *testing.T) {
	rec := &recorder{}
	client, server := pair(t, rec)
	v1 := append([]byte{1, 1, 'r', 0, 0, 0, 0, 0, 0, 0, 20}, "/v1/chat/completions\x00"...)
	newer, _ := EncodeHeader(nil, Header{RequestID: "n"})
	newer[0] = Version + 1
	tests := []struct {
		name   string
		hdr    []byte
		status int
		code   string
		is     error
		reason string
	}{
		{"version 1", v1, StatusVersion, CodeVersion, ErrVersion, reasonVersion},
		{"newer version", newer, StatusVersion, CodeVersion, ErrVersion, reasonVersion},
		{"unknown kind", []byte{Version, byte(numKinds), 0xff}, StatusKind, CodeKind, ErrKind, reasonKind},
		{"unknown endpoint", rawHeader(Version, KindRequest, byte(numEndpoints), 0, 0, 0, 0), StatusKind, CodeKind, ErrKind, reasonKind},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := server.rejected(tt.reason)
			// A body larger than a stream's flow-control window: the ingress must be able to
			// write all of it, as an ingress on any version does before it reads the answer.
			body := bytes.Repeat([]byte{'x'}, 2<<20)
			wire := append(appendFrameHead(nil, frameHeader, len(tt.hdr)), tt.hdr...)
			wire = append(appendFrameHead(wire, frameBody, len(body)), body...)
			typ, p, err := rawAnswer(t, server.addr(), client.tr.clientTLS, wire)
			if err != nil || typ != frameRefuse {
				t.Fatalf("answer frame %d, %v; want a refusal", typ, err)
			}
			r, err := decodeRefuse(p)
			if err != nil {
				t.Fatalf("refusal: %v", err)
			}
			if r.Status != tt.status || r.Code != tt.code || !errors.Is(r, tt.is) {
				t.Errorf("refusal %v, want %d %s (errors.Is %v)", r, tt.status, tt.code, tt.is)
			}
			if got := server.rejected(tt.reason); got != before+1 {
				t.Errorf("rejected{%s} = %v, want %v", tt.reason, got, before+1)
			}
		})
	}
	if rec.n() != 0 {
		t.Errorf("handler ran %d times for unreadable headers", rec.n())
	}
}

// rawOpen opens a stream on a fresh, properly authenticated connection, as Forward does; the
// connection closes when the test ends.
func rawOpen(t *testing.T, addr string, conf *tls.Config) *quic.Stream {
	t.Helper()
	ctx := testCtx(t)
	c, err := quic.DialAddr(ctx, addr, conf, &quic.Config{MaxIdleTimeout: 2 * time.Second})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = c.CloseWithError(0, "") })
	str, err := c.OpenStreamSync(ctx)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return str
}

// rawAnswer writes wire on a fresh, properly authenticated connection, as Forward does, and
// returns the owner's first answer frame, or the error that stopped the write.
func rawAnswer(t *testing.T, addr string, conf *tls.Config, wire []byte) (byte, []byte, error) {
	t.Helper()
	str := rawOpen(t, addr, conf)
	if _, err := str.Write(wire); err != nil {
		return 0, nil, err
	}
	if err := str.Close(); err != nil {
		return 0, nil, err
	}
	return readFrame(bufio.NewReader(str), MaxAnswerBytes)
}

// rawOwner stands in for a peer that serves forwards its own way: it takes the connection of
// the client node it returns, and calls serve with each stream and the payload of its header
// frame.
func rawOwner(t *testing.T, serve func(str *quic.Stream, hdr []byte)) (client *node, addr string) {
	t.Helper()
	dir := pki(t, "a", "b")
	ln, err := quic.ListenAddr("127.0.0.1:0", loadTLS(t, dir, "b"), &quic.Config{MaxIdleTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept(context.Background())
		if err != nil {
			return
		}
		defer c.CloseWithError(0, "")
		for { // until the client closes the connection
			str, err := c.AcceptStream(context.Background())
			if err != nil {
				return
			}
			if _, p, err := readFrame(bufio.NewReader(str), MaxHeaderBytes); err == nil {
				serve(str, p)
			}
		}
	}()
	client = startNode(t, loadTLS(t, dir, "a"), "127.0.0.1:0", nil)
	t.Cleanup(func() {
		_ = client.tr.Close()
		_ = ln.Close()
		<-done
	})
	return client, ln.Addr().String()
}

// resetAsMalformed is what a peer's serveStream does with a header it cannot decode.
func resetAsMalformed(str *quic.Stream) {
	str.CancelRead(codeProtocol)
	str.CancelWrite(codeProtocol)
}

// TestForwardToVersion1Owner stands in for a node on frame version 1, which resets the stream
// of any header it cannot decode as malformed: the ingress gets an error that says so and
// lets it try another peer.
func TestForwardToVersion1Owner(t *testing.T) {
	sawVersion := make(chan byte, 1)
	client, addr := rawOwner(t, func(str *quic.Stream, hdr []byte) {
		if len(hdr) > 0 {
			sawVersion <- hdr[0]
		}
		resetAsMalformed(str)
	})
	_, err := client.tr.Forward(testCtx(t), addr, Header{RequestID: "r"}, []byte("{}"))
	var ref *Refusal
	if !errors.Is(err, ErrUnreachable) || !errors.Is(err, ErrRejected) || errors.As(err, &ref) {
		t.Errorf("Forward = %v, want ErrUnreachable and ErrRejected", err)
	}
	select {
	case v := <-sawVersion:
		if v != Version {
			t.Errorf("the owner saw frame version %d, want %d", v, Version)
		}
	default:
		t.Error("the owner read no header")
	}
}

// refuseVersion answers str as a peer of PreviousVersion answers a header of Version.
func refuseVersion(str *quic.Stream) {
	r, _ := encodeRefuse(Refusal{Status: StatusVersion, Code: CodeVersion, Message: "m"})
	_, _ = str.Write(append(appendFrameHead(nil, frameRefuse, len(r)), r...))
	_ = str.Close()
}

// TestForwardToPreviousVersionOwner stands in for a peer that speaks PreviousVersion only: it
// refuses a header of Version as of another version, Forward sends it again in
// PreviousVersion, with every field, and sends the next forward to that peer in it at once.
func TestForwardToPreviousVersionOwner(t *testing.T) {
	seen := make(chan Header, 4)
	client, addr := rawOwner(t, func(str *quic.Stream, p []byte) {
		if len(p) > 0 && p[0] != PreviousVersion {
			seen <- Header{Version: int(p[0])}
			refuseVersion(str)
			return
		}
		h, _ := DecodeHeader(p)
		seen <- h
		r, _ := encodeRefuse(Refusal{Status: 429, Code: "read"})
		_, _ = str.Write(append(appendFrameHead(nil, frameRefuse, len(r)), r...))
		_ = str.Close()
	})
	h := Header{RequestID: "r", TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Prefill: true,
		QueueTTL: time.Minute, QueueTTLLeft: time.Second}
	var ref *Refusal
	for i := range 2 {
		if _, err := client.tr.Forward(testCtx(t), addr, h, []byte("{}")); !errors.As(err, &ref) || ref.Code != "read" {
			t.Fatalf("Forward %d = %v, want the owner's answer to the header in version %d", i, err, PreviousVersion)
		}
	}
	want := h
	want.Version = PreviousVersion
	for i, v := range []int{Version, PreviousVersion, PreviousVersion} {
		got := <-seen
		if got.Version != v || v == PreviousVersion && !reflect.DeepEqual(got, want) {
			t.Errorf("send %d: %+v, want version %d", i, got, v)
		}
	}
	if len(seen) != 0 {
		t.Errorf("%d more sends", len(seen))
	}
}

// forwardToOlderOwner forwards h to a peer of PreviousVersion that refuses Version and resets
// as malformed the stream of a header it cannot read (unreadable says which) and refuses the
// others with code "read", and returns the headers of PreviousVersion it read: h, then what
// Forward sent again.
func forwardToOlderOwner(t *testing.T, h Header, unreadable func(Header) bool) (first, second Header) {
	t.Helper()
	seen := make(chan Header, 3)
	client, addr := rawOwner(t, func(str *quic.Stream, p []byte) {
		if len(p) > 0 && p[0] != PreviousVersion {
			refuseVersion(str)
			return
		}
		h, err := DecodeHeader(p)
		if err != nil {
			return
		}
		seen <- h
		if unreadable(h) {
			resetAsMalformed(str)
			return
		}
		r, _ := encodeRefuse(Refusal{Status: 429, Code: "read"})
		_, _ = str.Write(append(appendFrameHead(nil, frameRefuse, len(r)), r...))
		_ = str.Close()
	})
	_, err := client.tr.Forward(testCtx(t), addr, h, []byte("{}"))
	var ref *Refusal
	if !errors.As(err, &ref) || ref.Code != "read" {
		t.Fatalf("Forward = %v, want the owner's answer to the header sent again", err)
	}
	first, second = <-seen, <-seen
	// The next forward to that peer goes without the fields it cannot read, in one send.
	if _, err := client.tr.Forward(testCtx(t), addr, h, []byte("{}")); !errors.As(err, &ref) || ref.Code != "read" {
		t.Fatalf("second Forward = %v, want the owner's answer at once", err)
	}
	if third := <-seen; unreadable(third) || len(seen) != 0 {
		t.Errorf("second forward sent %+v first (%d more), want the header without what the peer cannot read, once", third, len(seen))
	}
	return first, second
}

// TestForwardToOwnerWithoutTraceContext stands in for a peer of this frame version built before
// the trace context, which resets the stream of a header carrying one as malformed: Forward
// sends the header again without it, and the peer runs the request.
func TestForwardToOwnerWithoutTraceContext(t *testing.T) {
	h := Header{RequestID: "r", TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", TraceState: "k=v"}
	// What the older peer's decoder makes of the trace flag.
	first, second := forwardToOlderOwner(t, h, func(h Header) bool { return h.TraceParent != "" })
	if first.TraceParent != h.TraceParent || first.TraceState != h.TraceState {
		t.Errorf("first attempt carried %q %q, want the trace context", first.TraceParent, first.TraceState)
	}
	if second.TraceParent != "" || second.TraceState != "" || second.RequestID != "r" {
		t.Errorf("second attempt %+v, want the same header without a trace context", second)
	}
}

// TestForwardToOwnerWithoutResume stands in for a peer built before Header.Resume, which resets
// the stream of a header carrying one as malformed: Forward does not send the continuation
// again without it (it would run as a new request), so the ingress tries another peer.
func TestForwardToOwnerWithoutResume(t *testing.T) {
	seen := make(chan Header, 2)
	client, addr := rawOwner(t, func(str *quic.Stream, p []byte) {
		h, err := DecodeHeader(p)
		if err != nil {
			return
		}
		seen <- h
		resetAsMalformed(str) // what the older peer's decoder makes of the resume flag
	})
	h := Header{RequestID: "r", TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		Resume: &Resume{Seed: 1, Tokens: 2, Bytes: 8}}
	_, err := client.tr.Forward(testCtx(t), addr, h, []byte("{}"))
	if !errors.Is(err, ErrUnreachable) || !errors.Is(err, ErrRejected) {
		t.Fatalf("Forward = %v, want ErrUnreachable and ErrRejected", err)
	}
	if first := <-seen; first.Resume == nil || *first.Resume != *h.Resume {
		t.Errorf("the owner read %+v, want the continuation", first.Resume)
	}
	select {
	case again := <-seen:
		t.Errorf("Forward sent the continuation again: %+v", again)
	default:
	}
}

// TestForwardHalfToOwnerWithoutRoles stands in for a peer built before Header.Prefill and
// Header.Handover: Forward does not send either half again without its mark, even with a trace
// context that it would otherwise drop and retry.
func TestForwardHalfToOwnerWithoutRoles(t *testing.T) {
	for _, h := range []Header{
		{RequestID: "p", TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Prefill: true},
		{RequestID: "d", TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Handover: &Handover{PromptTokens: 5}},
	} {
		seen := make(chan Header, 2)
		client, addr := rawOwner(t, func(str *quic.Stream, p []byte) {
			got, err := DecodeHeader(p)
			if err != nil {
				return
			}
			seen <- got
			resetAsMalformed(str)
		})
		_, err := client.tr.Forward(testCtx(t), addr, h, []byte("{}"))
		if !errors.Is(err, ErrUnreachable) || !errors.Is(err, ErrRejected) {
			t.Fatalf("%s: Forward = %v, want ErrUnreachable and ErrRejected", h.RequestID, err)
		}
		if first := <-seen; first.Prefill != h.Prefill || (first.Handover == nil) != (h.Handover == nil) {
			t.Errorf("%s: the owner read %+v", h.RequestID, first)
		}
		select {
		case again := <-seen:
			t.Errorf("%s: Forward sent the half again: %+v", h.RequestID, again)
		default:
		}
	}
}

// TestForwardToOwnerWithoutQueueTTL stands in for a peer built before Header.QueueTTL (after
// Prefill): Forward sends the header again without the queue TTL, and without its trace
// context, but with the rest (a prefill half stays one), and the peer runs it.
func TestForwardToOwnerWithoutQueueTTL(t *testing.T) {
	h := Header{RequestID: "r", TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Prefill: true,
		QueueTTL: time.Minute, QueueTTLLeft: time.Second}
	// What the older peer's decoder makes of the queue TTL flag.
	first, second := forwardToOlderOwner(t, h, func(h Header) bool { return h.QueueTTL != 0 })
	if first.QueueTTL != h.QueueTTL || first.QueueTTLLeft != h.QueueTTLLeft || first.TraceParent != h.TraceParent {
		t.Errorf("first attempt %+v, want the queue TTL and the trace context", first)
	}
	if second.QueueTTL != 0 || second.QueueTTLLeft != 0 || second.TraceParent != "" || !second.Prefill || second.RequestID != "r" {
		t.Errorf("second attempt %+v, want the same prefill half without a queue TTL or a trace context", second)
	}
}

func validHeaderFrame() []byte {
	hdr, _ := EncodeHeader(nil, Header{RequestID: "v"})
	return append(appendFrameHead(nil, frameHeader, len(hdr)), hdr...)
}

// rawStream writes wire on a fresh, properly authenticated connection and returns how the
// owner ended the stream.
func rawStream(t *testing.T, addr string, conf *tls.Config, wire []byte) error {
	t.Helper()
	str := rawOpen(t, addr, conf)
	_, _ = str.Write(wire)
	_ = str.Close()
	_, err := io.ReadAll(str)
	return err
}

func TestConnectionReuse(t *testing.T) {
	client, server := pair(t, HandlerFunc(func(_ context.Context, h Header, _ []byte, w ResponseWriter) {
		_, _ = io.WriteString(w, h.RequestID)
	}))
	const n = 16
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n { // concurrent first uses must share one dial
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprint("r", i)
			resp, err := client.tr.Forward(testCtx(t), server.addr(), Header{RequestID: id}, nil)
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			data, err := io.ReadAll(resp.Body)
			if err != nil || string(data) != id {
				errs <- fmt.Errorf("%s: body %q, %v", id, data, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if in, out := server.conns(dirIn), client.conns(dirOut); in != 1 || out != 1 {
		t.Errorf("connections in=%v out=%v, want 1 and 1", in, out)
	}
	if got := testutil.ToFloat64(server.tr.m.streams.WithLabelValues(dirIn, resultAccepted)); got != n {
		t.Errorf("in accepted streams = %v, want %d", got, n)
	}
}

func TestReconnectAfterPeerRestart(t *testing.T) {
	dir := pki(t, "a", "b")
	echo := HandlerFunc(func(_ context.Context, _ Header, b []byte, w ResponseWriter) { _, _ = w.Write(b) })
	server := startNode(t, loadTLS(t, dir, "b"), "127.0.0.1:0", echo)
	client := startNode(t, loadTLS(t, dir, "a"), "127.0.0.1:0", nil)
	addr := server.addr()
	roundTrip := func(t *testing.T, msg string) {
		t.Helper()
		resp, err := client.tr.Forward(testCtx(t), addr, Header{RequestID: msg}, []byte(msg))
		if err != nil {
			t.Fatalf("%s: %v", msg, err)
		}
		defer resp.Body.Close()
		if data, err := readAll(t, resp.Body); err != nil || string(data) != msg {
			t.Fatalf("%s: body %q, %v", msg, data, err)
		}
	}
	roundTrip(t, "before")
	if err := server.tr.Close(); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "the client to see the close", func() bool { return client.conns(dirOut) == 0 })
	startNode(t, loadTLS(t, dir, "b"), addr, echo)
	roundTrip(t, "after")
	if got := client.conns(dirOut); got != 1 {
		t.Errorf("client connections = %v, want 1", got)
	}
}

func TestHTTPResponseWriterRelaysExactly(t *testing.T) {
	sse := "data: {\"a\":1}\n\ndata: [DONE]\n\n"
	client, server := pair(t, HandlerFunc(func(_ context.Context, _ Header, _ []byte, w ResponseWriter) {
		hw := HTTPResponseWriter(w)
		hw.Header().Set("Content-Type", "text/event-stream")
		hw.Header().Add("X-Multi", "1")
		hw.Header().Add("X-Multi", "2")
		hw.WriteHeader(http.StatusContinue) // informational: not relayed
		hw.WriteHeader(http.StatusCreated)
		hw.WriteHeader(http.StatusTeapot) // superfluous: ignored, as in net/http
		for _, part := range strings.SplitAfter(sse, "\n\n") {
			_, _ = io.WriteString(hw, part)
			hw.(http.Flusher).Flush()
		}
	}))
	resp, err := client.tr.Forward(testCtx(t), server.addr(), Header{RequestID: "h"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	want := map[string]string{"Content-Type": "text/event-stream", "X-Multi": "1, 2"}
	if resp.Status != http.StatusCreated || !reflect.DeepEqual(resp.Headers, want) {
		t.Errorf("status %d headers %v, want 201 %v", resp.Status, resp.Headers, want)
	}
	if data, err := readAll(t, resp.Body); err != nil || string(data) != sse {
		t.Errorf("body %q, %v; want %q", data, err, sse)
	}
}

func TestMetricsExposition(t *testing.T) {
	client, server := pair(t, HandlerFunc(func(_ context.Context, _ Header, _ []byte, w ResponseWriter) {}))
	resp, err := client.tr.Forward(testCtx(t), server.addr(), Header{RequestID: "m"}, nil)
	if err == nil {
		resp.Body.Close()
	}
	const want = `
# HELP kvmesh_transport_streams_total Forward streams by direction (in, out) and how they were answered.
# TYPE kvmesh_transport_streams_total counter
kvmesh_transport_streams_total{direction="in",result="refused"} 1
# HELP kvmesh_transport_connections Open peer QUIC connections by direction (in: accepted, out: dialed).
# TYPE kvmesh_transport_connections gauge
kvmesh_transport_connections{direction="in"} 1
kvmesh_transport_connections{direction="out"} 0
`
	if err := testutil.GatherAndCompare(server.reg, strings.NewReader(want), "kvmesh_transport_streams_total", "kvmesh_transport_connections"); err != nil {
		t.Error(err)
	}
}

func TestLifecycle(t *testing.T) {
	dir := pki(t, "a")
	conf := loadTLS(t, dir, "a")
	tr, err := New(testConfig(t, conf, "127.0.0.1:0", nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Forward(testCtx(t), "127.0.0.1:1", Header{}, nil); !errors.Is(err, ErrNotStarted) {
		t.Errorf("Forward before Start = %v, want ErrNotStarted", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := tr.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if tr.Addr() == nil {
		t.Fatal("no address after Start")
	}
	cancel() // cancelling Start's context closes the transport
	poll.Until(t, 5*time.Second, "the transport to close", func() bool {
		_, err := tr.Forward(testCtx(t), "127.0.0.1:1", Header{}, nil)
		return errors.Is(err, ErrClosed)
	})
	if err := tr.Close(); err != nil {
		t.Errorf("Close after context close: %v", err)
	}
	if err := tr.Start(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Start after Close = %v", err)
	}

	bad := []struct {
		name string
		mut  func(*Config)
	}{
		{"no tls", func(c *Config) { c.TLS = nil }},
		{"no cert", func(c *Config) { c.TLS = c.TLS.Clone(); c.TLS.Certificates = nil }},
		{"no ca", func(c *Config) { c.TLS = c.TLS.Clone(); c.TLS.RootCAs = nil }},
		{"keepalive above idle", func(c *Config) { c.KeepAlive = 2 * c.IdleTimeout }},
		{"negative timeout", func(c *Config) { c.HandshakeTimeout = -1 }},
		{"negative body", func(c *Config) { c.MaxBodyBytes = -1 }},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t, conf, "127.0.0.1:0", nil)
			tt.mut(&cfg)
			if _, err := New(cfg); err == nil {
				t.Error("New accepted an invalid config")
			}
		})
	}
}

func TestForwardRejectsOversizedBody(t *testing.T) {
	client, server := pair(t, &recorder{})
	_, err := client.tr.Forward(testCtx(t), server.addr(), Header{}, make([]byte, client.tr.cfg.MaxBodyBytes+1))
	if !errors.Is(err, ErrTooLarge) {
		t.Errorf("Forward = %v, want ErrTooLarge", err)
	}
	_, err = client.tr.Forward(testCtx(t), server.addr(), Header{Hops: -1}, nil)
	if !errors.Is(err, ErrMalformed) {
		t.Errorf("Forward with a bad header = %v, want ErrMalformed", err)
	}
}

// TestHandlerSeesThePeersCertificateName pins that a handler learns whose certificate the
// forward came with (PeerName), to check the name the header claims.
func TestHandlerSeesThePeersCertificateName(t *testing.T) {
	type peerName struct {
		name        string
		anyNode, ok bool
	}
	saw := make(chan peerName, 1)
	client, server := pair(t, HandlerFunc(func(ctx context.Context, _ Header, _ []byte, w ResponseWriter) {
		var p peerName
		p.name, p.anyNode, p.ok = PeerName(ctx)
		saw <- p
		_ = w.Accept(http.StatusOK, nil)
	}))
	resp, err := client.tr.Forward(testCtx(t), server.addr(), Header{RequestID: "r", Ingress: "a"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if p := <-saw; p != (peerName{name: "a", ok: true}) {
		t.Errorf("PeerName = %+v, want the client's certificate, a", p)
	}
	if _, _, ok := PeerName(context.Background()); ok {
		t.Error("PeerName outside a forward reported a peer")
	}
}
