package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
)

// Config configures a Subscriber.
type Config struct {
	// Endpoint is the engine's publisher. tcp://host:port dials a publisher that binds
	// (vLLM's and SGLang's, whose default port is 5557); bind:tcp://host:port (BindPrefix)
	// listens for a publisher that dials, on every interface with host *, on a free port with
	// port 0 (Addr says which). Required.
	Endpoint string
	// Topic is the subscription's topic prefix; "" (the default) takes every topic.
	Topic string
	// OnBatch receives each batch read, in order, on Run's goroutine. Required.
	OnBatch func(Batch)
	// RetryInterval is the wait before dialling again after a failed dial or a lost
	// connection, or binding again after a failed bind. Default 1s.
	RetryInterval time.Duration
	// SilentAfter is how long the publisher may send nothing before the subscriber counts
	// and logs it silent (kvmesh_engine_kv_event_silences_total), and again each SilentAfter
	// it stays so. An idle engine is silent too. Default 1m.
	SilentAfter time.Duration
	Logger      *slog.Logger
	// Registerer receives the subscriber's metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Subscriber reads an engine's KV cache events. See the package doc.
type Subscriber struct {
	cfg  Config
	addr string // host:port, to dial or to bind
	bind bool
	log  *slog.Logger

	events    *prometheus.CounterVec
	gaps      prometheus.Counter
	bad       prometheus.Counter
	connected prometheus.Gauge
	silences  prometheus.Counter

	bound      atomic.Pointer[string] // the bound endpoint, with bind
	publishers atomic.Int64           // publishers connected, with bind
	online     atomic.Bool            // connected to a publisher (dialled, or one dialled in)
	heard      atomic.Bool            // a message came since the silence watch last looked
	fresh      atomic.Bool            // a connection began since the last message

	// Sequence state, on Run's goroutine: the last sequence number read, and whether a
	// message since then was lost.
	last     uint64
	haveLast bool
	lost     bool
}

// NewSubscriber validates cfg and registers the metrics. It does no I/O.
func NewSubscriber(cfg Config) (*Subscriber, error) {
	ep, bind := strings.CutPrefix(cfg.Endpoint, BindPrefix)
	addr, err := parseEndpoint(ep, !bind)
	if err != nil {
		return nil, err
	}
	if cfg.OnBatch == nil {
		return nil, errors.New("kvevents: OnBatch is required")
	}
	if cfg.RetryInterval < 0 || cfg.SilentAfter < 0 {
		return nil, errors.New("kvevents: negative interval")
	}
	if cfg.RetryInterval == 0 {
		cfg.RetryInterval = time.Second
	}
	if cfg.SilentAfter == 0 {
		cfg.SilentAfter = time.Minute
	}
	s := &Subscriber{cfg: cfg, addr: addr, bind: bind, log: cfg.Logger}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.events = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_engine_kv_events_total",
		Help: "KV cache events read from the external engine's publisher, by type (stored, removed, cleared, unknown).",
	}, []string{"type"})
	s.gaps = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_engine_kv_event_gaps_total",
		Help: "Sequence gaps in the external engine's KV event stream: times batches were missed.",
	})
	s.bad = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_engine_kv_event_decode_errors_total",
		Help: "Messages from the external engine's KV event publisher that could not be decoded.",
	})
	s.connected = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvmesh_engine_kv_events_connected",
		Help: "1 while the node is connected to the external engine's KV event publisher.",
	})
	s.silences = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_engine_kv_event_silences_total",
		Help: "Silence windows (a minute by default) in which the external engine's KV event publisher sent nothing: not connected, or connected and quiet.",
	})
	if reg := cfg.Registerer; reg != nil {
		for _, c := range []prometheus.Collector{s.events, s.gaps, s.bad, s.connected, s.silences} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("kvevents: registering metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Addr is the endpoint a bound subscriber listens on, tcp://host:port with the port it took
// ("" before it binds, and without bind).
func (s *Subscriber) Addr() string {
	if p := s.bound.Load(); p != nil {
		return *p
	}
	return ""
}

// Run dials the publisher, or binds for one to dial in, and reads it until ctx ends; it dials
// again after RetryInterval whenever the dial fails or the connection is lost, and binds again
// when the bind fails. It returns nil once ctx has ended and everything it started has
// stopped.
func (s *Subscriber) Run(ctx context.Context) error {
	registerGuarded()
	watchDone := make(chan struct{})
	wctx, stopWatch := context.WithCancel(ctx)
	go func() {
		defer close(watchDone)
		s.watchSilence(wctx)
	}()
	defer func() {
		stopWatch()
		<-watchDone
	}()
	session, what := s.dialSession, "not connected; dialling again"
	if s.bind {
		session, what = s.bindSession, "not listening; binding again"
	}
	quiet := false // a failure already logged since the last connection
	for {
		connected, err := session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		level := slog.LevelWarn
		if quiet && !connected {
			level = slog.LevelDebug
		}
		quiet = true
		s.log.Log(ctx, level, "engine kv events: "+what, "endpoint", s.cfg.Endpoint,
			"retry", s.cfg.RetryInterval, "err", err)
		t := time.NewTimer(s.cfg.RetryInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// newSocket is a SUB socket on ctx, subscribed to the topic.
func (s *Subscriber) newSocket(ctx context.Context) (zmq4.Socket, error) {
	sock := zmq4.NewSub(ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(handshakeTimeout),
		zmq4.WithLogger(slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)))
	if err := sock.SetOption(zmq4.OptionSubscribe, s.cfg.Topic); err != nil {
		sock.Close()
		return nil, err
	}
	return sock, nil
}

// dialSession dials once and reads until the connection or ctx ends; it reports whether it
// connected.
func (s *Subscriber) dialSession(ctx context.Context) (bool, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sock, err := s.newSocket(sctx)
	if err != nil {
		return false, err
	}
	defer sock.Close()
	if err := sock.Dial(guardedScheme + "://" + s.addr); err != nil {
		return false, err
	}
	s.fresh.Store(true)
	s.setOnline(true)
	defer s.setOnline(false)
	s.log.Info("engine kv events: connected", "endpoint", s.cfg.Endpoint)
	warned := false
	for {
		msg, err := sock.Recv()
		if err != nil {
			return true, err
		}
		s.read(msg, &warned)
	}
}

// bindSession binds and reads what publishers that dial in send, until ctx ends; a
// publisher's lost connection does not end it. It reports whether it bound.
func (s *Subscriber) bindSession(ctx context.Context) (bool, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hooks := &connHooks{
		ready: func(remote net.Addr) {
			s.fresh.Store(true)
			s.setOnline(s.publishers.Add(1) > 0)
			s.log.Info("engine kv events: a publisher connected", "endpoint", s.Addr(), "publisher", remote.String())
		},
		gone: func(remote net.Addr) {
			s.setOnline(s.publishers.Add(-1) > 0)
			s.log.Info("engine kv events: a publisher disconnected", "endpoint", s.Addr(), "publisher", remote.String())
		},
	}
	sock, err := s.newSocket(withHooks(sctx, hooks))
	if err != nil {
		return false, err
	}
	defer sock.Close()
	if err := sock.Listen(guardedScheme + "://" + s.addr); err != nil {
		return false, err
	}
	bound := "tcp://" + sock.Addr().String()
	s.bound.Store(&bound)
	s.log.Info("engine kv events: listening for a publisher to dial in", "endpoint", bound)
	warned := false
	for {
		msg, err := sock.Recv()
		if sctx.Err() != nil {
			return true, nil
		}
		if err != nil {
			// One publisher's connection ended; the socket listens on.
			s.log.Debug("engine kv events: a publisher's connection ended", "err", err)
			continue
		}
		s.read(msg, &warned)
	}
}

func (s *Subscriber) setOnline(on bool) {
	s.online.Store(on)
	if on {
		s.connected.Set(1)
	} else {
		s.connected.Set(0)
	}
}

// read handles one message received; warned says whether an undecodable one was logged at
// warning level since the session began.
func (s *Subscriber) read(msg zmq4.Msg, warned *bool) {
	if msg.Type == zmq4.CmdMsg {
		return
	}
	s.heard.Store(true)
	if err := s.handle(msg.Frames); err != nil {
		s.bad.Inc()
		if !*warned {
			*warned = true
			s.log.Warn("engine kv events: undecodable message (is the endpoint an engine's --kv-events-config publisher?)",
				"endpoint", s.cfg.Endpoint, "err", err)
		} else {
			s.log.Debug("engine kv events: undecodable message", "err", err)
		}
	}
}

// watchSilence looks every SilentAfter until ctx ends: a window in which no message came is
// counted, and logged when silentLogged says.
func (s *Subscriber) watchSilence(ctx context.Context) {
	t := time.NewTicker(s.cfg.SilentAfter)
	defer t.Stop()
	windows := 0 // silent windows in a row
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s.heard.Swap(false) {
			if windows > 0 {
				s.log.Info("engine kv events: the publisher speaks again", "endpoint", s.cfg.Endpoint,
					"silent_for", time.Duration(windows)*s.cfg.SilentAfter)
			}
			windows = 0
			continue
		}
		windows++
		s.silences.Inc()
		if silentLogged(windows) {
			s.logSilence(ctx, time.Duration(windows)*s.cfg.SilentAfter)
		}
	}
}

// silentLogged says whether the n-th silent window in a row is logged: the 1st, 2nd, 4th,
// 8th... and every 64th, so a publisher silent for good is logged about hourly.
func silentLogged(n int) bool {
	return n > 0 && (n&(n-1) == 0 || n%64 == 0)
}

// logSilence logs a silence of d, with what it likely means.
func (s *Subscriber) logSilence(ctx context.Context, d time.Duration) {
	var hint string
	switch {
	case s.online.Load():
		hint = "connected and quiet: the engine is idle, or its events are off (vLLM's enable_kv_cache_events)"
	case s.bind:
		hint = "no publisher has dialled in: point the engine's publisher at this endpoint; a publisher that binds (vLLM, SGLang) needs --engine-kv-events tcp://HOST:PORT instead"
	default:
		hint = "not connected: check the engine's --kv-events-config endpoint; a publisher that dials needs --engine-kv-events bind:tcp://*:PORT instead"
	}
	s.log.Log(ctx, slog.LevelWarn, "engine kv events: the publisher is silent", "endpoint", s.cfg.Endpoint,
		"for", d, "connected", s.online.Load(), "hint", hint)
}

// handle reads one message, [topic, 8-byte big-endian sequence number, payload], and hands
// its batch to OnBatch.
func (s *Subscriber) handle(frames [][]byte) error {
	if len(frames) != 3 || len(frames[1]) != 8 {
		s.lost = true
		return fmt.Errorf("%w: want 3 frames (topic, 8-byte sequence, payload), got %d", ErrMalformed, len(frames))
	}
	seq := binary.BigEndian.Uint64(frames[1])
	missed, restarted := s.sequence(seq)
	b, err := DecodeBatch(frames[2])
	if err != nil {
		s.lost = true
		return err
	}
	b.Seq, b.Missed, b.Restarted = seq, missed || s.lost, restarted
	s.lost = false
	for _, e := range b.Events {
		s.events.WithLabelValues(e.Kind.String()).Inc()
	}
	s.cfg.OnBatch(b)
	return nil
}

// sequence follows the sequence numbers: a number past the next is a gap; one not past the
// last is a new publisher (an engine numbers its batches from 0 when it starts). The first
// number of a connection is the publisher's start if it is 0, a new publisher's if it is not
// past the last one read, and else after a gap: the node joined a stream under way, or
// batches were lost while it was not connected.
func (s *Subscriber) sequence(seq uint64) (missed, restarted bool) {
	switch {
	case s.fresh.Swap(false) || !s.haveLast:
		restarted, missed = seq == 0 || (s.haveLast && seq <= s.last), seq != 0
	case seq <= s.last:
		restarted, missed = true, seq != 0
	case seq > s.last+1:
		missed = true
	}
	if s.haveLast && seq > s.last+1 {
		s.gaps.Inc()
	}
	s.last, s.haveLast = seq, true
	return missed, restarted
}
