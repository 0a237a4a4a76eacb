package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvmesh/kvmesh/internal/poll"
)

// startPublisher starts a Publisher on a free loopback port, closed at the test's end.
func startPublisher(t *testing.T, endpoint string) *Publisher {
	t.Helper()
	p, err := NewPublisher(PublisherConfig{Endpoint: endpoint})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// sub is a running Subscriber and the batches it has read.
type sub struct {
	s       *Subscriber
	batches chan Batch
}

// startSubscriber runs a Subscriber of endpoint, its config changed by mods, until the test
// ends, and waits for its Run to return then.
func startSubscriber(t *testing.T, endpoint string, mods ...func(*Config)) *sub {
	t.Helper()
	ch := make(chan Batch, 100)
	cfg := Config{Endpoint: endpoint, RetryInterval: 10 * time.Millisecond, OnBatch: func(b Batch) { ch <- b }}
	for _, mod := range mods {
		mod(&cfg)
	}
	s, err := NewSubscriber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return &sub{s: s, batches: ch}
}

// await publishes e until a batch arrives (a PUB socket drops what it sends before the
// subscription reaches it), and returns that batch.
func (s *sub) await(t *testing.T, p interface{ Publish(...Event) }, e Event) Batch {
	t.Helper()
	var got Batch
	poll.Until(t, 10*time.Second, "a batch to arrive", func() bool {
		p.Publish(e)
		select {
		case got = <-s.batches:
			return true
		case <-time.After(5 * time.Millisecond):
			return false
		}
	})
	return got
}

// sync waits for the subscription, then reads up to a marker batch and returns its sequence
// number: the next batch published is numbered one more.
func (s *sub) sync(t *testing.T, p *Publisher) uint64 {
	t.Helper()
	s.await(t, p, Event{Kind: Unknown})
	p.Publish(Event{Kind: Unknown})
	p.mu.Lock()
	marker := p.seq - 1
	p.mu.Unlock()
	for s.next(t).Seq != marker {
	}
	return marker
}

func (s *sub) next(t *testing.T) Batch {
	t.Helper()
	select {
	case b := <-s.batches:
		return b
	case <-time.After(10 * time.Second):
		t.Fatal("no batch")
		return Batch{}
	}
}

// send sends a raw message, its sequence number seq.
func send(p *Publisher, seq uint64, payload []byte) {
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seq)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sendLocked(nil, s[:], payload)
}

// TestSubscriberReadsPublishedBatches: a Publisher's batches reach a Subscriber whole and in
// order, numbered on from the last.
func TestSubscriberReadsPublishedBatches(t *testing.T) {
	p := startPublisher(t, "tcp://127.0.0.1:0")
	s := startSubscriber(t, p.Addr())
	last := s.sync(t, p)
	want := [][]Event{
		{{Kind: BlockStored, Hashes: []uint64{1, 2, 3}, BlockSize: 16, Medium: MediumGPU}},
		{{Kind: BlockRemoved, Hashes: []uint64{3}, Medium: MediumGPU}, {Kind: AllBlocksCleared}},
	}
	for _, evs := range want {
		p.Publish(evs...)
	}
	for i, evs := range want {
		b := s.next(t)
		if b.Seq != last+1+uint64(i) || b.Missed || b.Restarted || !reflect.DeepEqual(b.Events, evs) {
			t.Errorf("batch %d: seq %d missed %v restarted %v events %+v; want seq %d, %+v", i, b.Seq, b.Missed, b.Restarted, b.Events, last+1+uint64(i), evs)
		}
	}
	if v := testutil.ToFloat64(s.s.events.WithLabelValues("cleared")); v != 1 {
		t.Errorf("cleared events counted %v, want 1", v)
	}
}

// TestSubscriberFollowsTheSequence: a gap, an undecodable message and a wrong frame count each
// mark the next batch Missed and are counted; a sequence that starts over is a restart, and
// the stream goes on through all of them.
func TestSubscriberFollowsTheSequence(t *testing.T) {
	p := startPublisher(t, "tcp://127.0.0.1:0")
	s := startSubscriber(t, p.Addr())
	n := s.sync(t, p)
	ok := EncodeBatch(time.Now(), []Event{{Kind: AllBlocksCleared}})
	steps := []struct {
		name              string
		send              func()
		missed, restarted bool
		gaps, bad         float64
	}{
		{name: "the next number", send: func() { send(p, n+1, ok) }},
		{name: "a gap", send: func() { send(p, n+5, ok) }, missed: true, gaps: 1},
		{name: "garbage, then the next", send: func() { send(p, n+6, []byte("garbage")); send(p, n+7, ok) }, missed: true, gaps: 1, bad: 1},
		{name: "two frames, then the next", send: func() {
			p.mu.Lock()
			p.sendLocked([]byte("topic"), ok)
			p.mu.Unlock()
			send(p, n+8, ok)
		}, missed: true, gaps: 1, bad: 2},
		{name: "the sequence starts over", send: func() { send(p, 0, ok) }, restarted: true, gaps: 1, bad: 2},
		{name: "and goes on", send: func() { send(p, 1, ok) }, gaps: 1, bad: 2},
	}
	for _, st := range steps {
		st.send()
		b := s.next(t)
		if b.Missed != st.missed || b.Restarted != st.restarted {
			t.Errorf("%s: missed %v restarted %v, want %v %v", st.name, b.Missed, b.Restarted, st.missed, st.restarted)
		}
		if g, d := testutil.ToFloat64(s.s.gaps), testutil.ToFloat64(s.s.bad); g != st.gaps || d != st.bad {
			t.Errorf("%s: %v gaps and %v decode errors counted, want %v and %v", st.name, g, d, st.gaps, st.bad)
		}
	}
}

// TestSubscriberRedialsARestartedPublisher: when the publisher goes away and comes back on the
// same port, the subscriber dials again and reads the new one's batches as a restart.
func TestSubscriberRedialsARestartedPublisher(t *testing.T) {
	p := startPublisher(t, "tcp://127.0.0.1:0")
	addr := p.Addr()
	s := startSubscriber(t, addr)
	s.sync(t, p)
	// An engine that ran a while: the new one's first numbers are below its last.
	send(p, 1000, EncodeBatch(time.Now(), nil))
	s.next(t)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the subscriber to see the publisher gone", func() bool {
		return testutil.ToFloat64(s.s.connected) == 0
	})
	b := s.await(t, startPublisher(t, addr), Event{Kind: AllBlocksCleared})
	if !b.Restarted {
		t.Errorf("the new publisher's batch %d is not a restart", b.Seq)
	}
}

// TestSubscriberSurvivesBadPeers: a peer that says nothing, one that answers in another
// protocol, and one that hangs up neither panic the subscriber nor keep Run from returning
// when its context ends (TestMain checks no goroutine is left).
func TestSubscriberSurvivesBadPeers(t *testing.T) {
	peers := []struct {
		name  string
		serve func(c net.Conn)
	}{
		{"silent", func(c net.Conn) { _, _ = c.Read(make([]byte, 1)) }},
		{"speaks HTTP", func(c net.Conn) { _, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n")) }},
		{"hangs up", func(c net.Conn) {}},
	}
	for _, peer := range peers {
		t.Run(peer.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			accepted := make(chan struct{}, 10)
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					accepted <- struct{}{}
					peer.serve(c)
					c.Close()
				}
			}()
			s, err := NewSubscriber(Config{Endpoint: "tcp://" + ln.Addr().String(), RetryInterval: time.Millisecond,
				OnBatch: func(Batch) { t.Error("a batch from a bad peer") }})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx) }()
			<-accepted
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return after its context ended")
			}
			ln.Close()
		})
	}
}

// TestFrameGuardRefusesHugeFrames: the guard passes a publisher's greeting and frames however
// the reads split them, and fails the read that announces a frame above MaxFrameBytes.
func TestFrameGuardRefusesHugeFrames(t *testing.T) {
	long := func(size uint64) []byte {
		h := []byte{0x02, 0, 0, 0, 0, 0, 0, 0, 0}
		binary.BigEndian.PutUint64(h[1:], size)
		return h
	}
	stream := append(bytes.Repeat([]byte{0xff}, 64), 0x04, 3, 'a', 'b', 'c') // greeting, short command
	stream = append(stream, 0x01, 0)                                         // an empty frame, more to come
	stream = append(append(stream, long(5)...), "hello"...)                  // a long frame
	c, peer := net.Pipe()
	defer c.Close()
	defer peer.Close()
	for split := 1; split <= len(stream); split++ {
		g := &frameGuard{Conn: c, skip: 64}
		for i := 0; i < len(stream); i += split {
			if err := g.follow(stream[i:min(i+split, len(stream))]); err != nil {
				t.Fatalf("reads of %d bytes: %v", split, err)
			}
		}
		if g.frames != 3 || g.skip != 0 || g.hdrLen != 0 {
			t.Fatalf("reads of %d bytes: %d frames, %d to skip, %d header bytes", split, g.frames, g.skip, g.hdrLen)
		}
	}
	g := &frameGuard{Conn: c, skip: 64}
	huge := append(bytes.Repeat([]byte{0xff}, 64), long(MaxFrameBytes+1)...)
	if err := g.follow(huge); !errors.Is(err, errFrameTooLarge) {
		t.Errorf("a frame of %d bytes: err %v", MaxFrameBytes+1, err)
	}
}

// TestEndpoints: what a subscriber and a publisher accept as an endpoint.
func TestEndpoints(t *testing.T) {
	tests := []struct {
		ep       string
		sub, pub bool
	}{
		{"tcp://127.0.0.1:5557", true, true},
		{"tcp://[::1]:5557", true, true},
		{"tcp://*:5557", false, true},
		{"tcp://127.0.0.1:0", false, true},
		{"tcp://127.0.0.1", false, false},
		{"tcp://127.0.0.1:99999", false, false},
		{"bind:tcp://*:5557", true, false},
		{"bind:tcp://127.0.0.1:0", true, false},
		{"bind:tcp://127.0.0.1", false, false},
		{"bind:ipc:///tmp/kv", false, false},
		{"bind:", false, false},
		{"ipc:///tmp/kv", false, false},
		{"127.0.0.1:5557", false, false},
		{"", false, false},
	}
	for _, tt := range tests {
		_, err := NewSubscriber(Config{Endpoint: tt.ep, OnBatch: func(Batch) {}, Registerer: prometheus.NewRegistry()})
		if (err == nil) != tt.sub || (err != nil && !errors.Is(err, ErrEndpoint)) {
			t.Errorf("subscriber of %q: err %v", tt.ep, err)
		}
		_, err = NewPublisher(PublisherConfig{Endpoint: tt.ep})
		if (err == nil) != tt.pub {
			t.Errorf("publisher on %q: err %v", tt.ep, err)
		}
	}
}

// fresh, among TestSequenceNumbers' numbers, marks a new connection.
const fresh = ^uint64(0)

// TestSequenceNumbers: how each number read is judged, after those before it and the
// connection it came on.
func TestSequenceNumbers(t *testing.T) {
	tests := []struct {
		name              string
		seqs              []uint64 // read in turn; the last is judged
		missed, restarted bool
	}{
		{"the first read, 0: the publisher's start", []uint64{0}, false, true},
		{"the first read, past 0: joined under way", []uint64{5}, true, false},
		{"the next", []uint64{5, 6}, false, false},
		{"past the next: a gap", []uint64{5, 9}, true, false},
		{"back to 0: a new publisher read from its start", []uint64{5, 0}, false, true},
		{"back, past 0: a new publisher, its first batches lost", []uint64{5, 3}, true, true},
		{"the same again: a new publisher", []uint64{5, 5}, true, true},
		{"a new connection, the next number: maybe lost between", []uint64{5, fresh, 6}, true, false},
		{"a new connection, from 0: a publisher read from its start", []uint64{5, fresh, 0}, false, true},
		{"a new connection, back: a new publisher", []uint64{5, fresh, 2}, true, true},
		{"a new connection, past the next: lost between", []uint64{5, fresh, 9}, true, false},
		{"after a new connection's first, the next", []uint64{5, fresh, 9, 10}, false, false},
	}
	for _, tt := range tests {
		s, err := NewSubscriber(Config{Endpoint: "tcp://127.0.0.1:1", OnBatch: func(Batch) {}})
		if err != nil {
			t.Fatal(err)
		}
		var missed, restarted bool
		for _, seq := range tt.seqs {
			if seq == fresh {
				s.fresh.Store(true)
				continue
			}
			missed, restarted = s.sequence(seq)
		}
		if missed != tt.missed || restarted != tt.restarted {
			t.Errorf("%s: missed %v restarted %v, want %v %v", tt.name, missed, restarted, tt.missed, tt.restarted)
		}
	}
}

// dialling is a publisher of another make that dials its subscriber: zmq4's own PUB socket
// over its own TCP transport, numbering its batches from 0.
type dialling struct {
	sock zmq4.Socket
	seq  uint64
}

// dialPublisher dials a PUB socket to endpoint, closed at the test's end.
func dialPublisher(t *testing.T, endpoint string) *dialling {
	t.Helper()
	sock := zmq4.NewPub(context.Background(), zmq4.WithLogger(log.New(io.Discard, "", 0)))
	if err := sock.Dial(endpoint); err != nil {
		t.Fatal(err)
	}
	p := &dialling{sock: sock}
	t.Cleanup(p.close)
	return p
}

func (p *dialling) Publish(events ...Event) {
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], p.seq)
	p.seq++
	_ = p.sock.SendMulti(zmq4.NewMsgFrom([]byte("kv-events"), seq[:], EncodeBatch(time.Now(), events)))
}

func (p *dialling) close() { _ = p.sock.Close() }

// bound starts a subscriber that binds a free loopback port and returns it once bound.
func bound(t *testing.T, mods ...func(*Config)) *sub {
	t.Helper()
	s := startSubscriber(t, BindPrefix+"tcp://127.0.0.1:0", mods...)
	poll.Until(t, 10*time.Second, "the subscriber to bind", func() bool { return s.s.Addr() != "" })
	return s
}

// TestBoundSubscriberReadsDiallingPublishers: with bind:, the subscriber listens and a
// publisher that dials it delivers its batches whole; it counts as connected from its
// handshake to its hang-up, and a publisher dialling in after it (a restarted engine) is read
// as a restart.
func TestBoundSubscriberReadsDiallingPublishers(t *testing.T) {
	s := bound(t)
	if v := testutil.ToFloat64(s.s.connected); v != 0 {
		t.Errorf("connected %v before any publisher dialled", v)
	}
	p := dialPublisher(t, s.s.Addr())
	want := []Event{{Kind: BlockStored, Hashes: []uint64{1, 2}, BlockSize: 16, Medium: MediumGPU}}
	b := s.await(t, p, want[0])
	if !reflect.DeepEqual(b.Events, want) {
		t.Errorf("events %+v, want %+v", b.Events, want)
	}
	if v := testutil.ToFloat64(s.s.connected); v != 1 {
		t.Errorf("connected %v with a publisher dialled in", v)
	}
	// An engine that ran a while: the next one's first numbers are below its last.
	p.seq = 1000
	p.Publish(Event{Kind: Unknown})
	for s.next(t).Seq != 1000 { // past those await sent after the first
	}
	p.close()
	poll.Until(t, 10*time.Second, "the publisher's hang-up to be seen", func() bool {
		return testutil.ToFloat64(s.s.connected) == 0
	})
	b = s.await(t, dialPublisher(t, s.s.Addr()), Event{Kind: AllBlocksCleared})
	if !b.Restarted {
		t.Errorf("the second publisher's batch %d is not a restart", b.Seq)
	}
}

// TestSilentPublisherIsCountedAndLogged: each window without a message is counted; the log
// says so at a bounded rate, with what the silence likely means.
func TestSilentPublisherIsCountedAndLogged(t *testing.T) {
	logs, err := os.Create(filepath.Join(t.TempDir(), "log")) // a file takes concurrent writes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logs.Close() })
	s := bound(t, func(c *Config) {
		c.SilentAfter = time.Millisecond
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	poll.Until(t, 10*time.Second, "three silent windows", func() bool {
		return testutil.ToFloat64(s.s.silences) >= 3
	})
	b, err := os.ReadFile(logs.Name())
	if err != nil {
		t.Fatal(err)
	}
	out := string(b)
	for _, want := range []string{"the publisher is silent", "no publisher has dialled in", "connected=false"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log lacks %q:\n%s", want, out)
		}
	}
}

// TestSilenceLogRate: the silent windows in a row that are logged.
func TestSilenceLogRate(t *testing.T) {
	var logged []int
	for n := range 200 {
		if silentLogged(n) {
			logged = append(logged, n)
		}
	}
	want := []int{1, 2, 4, 8, 16, 32, 64, 128, 192}
	if !slices.Equal(logged, want) {
		t.Errorf("logged windows %v, want %v", logged, want)
	}
}
