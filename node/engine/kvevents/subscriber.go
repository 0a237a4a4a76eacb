package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
)

// Config configures a Subscriber.
type Config struct {
	// Endpoint is the engine's publisher, tcp://host:port (vLLM's and SGLang's default port is
	// 5557). Required.
	Endpoint string
	// Topic is the subscription's topic prefix; "" (the default) takes every topic.
	Topic string
	// OnBatch receives each batch read, in order, on Run's goroutine. Required.
	OnBatch func(Batch)
	// RetryInterval is the wait before dialling again after a failed dial or a lost
	// connection. Default 1s.
	RetryInterval time.Duration
	Logger        *slog.Logger
	// Registerer receives the subscriber's metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Subscriber reads an engine's KV cache events. See the package doc.
type Subscriber struct {
	cfg  Config
	addr string
	log  *slog.Logger

	events    *prometheus.CounterVec
	gaps      prometheus.Counter
	bad       prometheus.Counter
	connected prometheus.Gauge

	// Sequence state, on Run's goroutine: the last sequence number read, and whether a
	// message since then was lost.
	last     uint64
	haveLast bool
	lost     bool
}

// NewSubscriber validates cfg and registers the metrics. It does no I/O.
func NewSubscriber(cfg Config) (*Subscriber, error) {
	addr, err := parseEndpoint(cfg.Endpoint, true)
	if err != nil {
		return nil, err
	}
	if cfg.OnBatch == nil {
		return nil, errors.New("kvevents: OnBatch is required")
	}
	if cfg.RetryInterval < 0 {
		return nil, errors.New("kvevents: negative retry interval")
	}
	if cfg.RetryInterval == 0 {
		cfg.RetryInterval = time.Second
	}
	s := &Subscriber{cfg: cfg, addr: addr, log: cfg.Logger}
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
	if reg := cfg.Registerer; reg != nil {
		for _, c := range []prometheus.Collector{s.events, s.gaps, s.bad, s.connected} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("kvevents: registering metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Run dials the publisher and reads it until ctx ends, dialling again after RetryInterval
// whenever the dial fails or the connection is lost. It returns nil once ctx has ended and
// everything it started has stopped.
func (s *Subscriber) Run(ctx context.Context) error {
	registerGuarded()
	quiet := false // a failure already logged since the last connection
	for {
		connected, err := s.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		level := slog.LevelWarn
		if quiet && !connected {
			level = slog.LevelDebug
		}
		quiet = true
		s.log.Log(ctx, level, "engine kv events: not connected; dialling again", "endpoint", s.cfg.Endpoint,
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

// session dials once and reads until the connection or ctx ends; it reports whether it
// connected.
func (s *Subscriber) session(ctx context.Context) (bool, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sock := zmq4.NewSub(sctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(handshakeTimeout),
		zmq4.WithLogger(slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)))
	defer sock.Close()
	if err := sock.SetOption(zmq4.OptionSubscribe, s.cfg.Topic); err != nil {
		return false, err
	}
	if err := sock.Dial(guardedScheme + "://" + s.addr); err != nil {
		return false, err
	}
	s.connected.Set(1)
	defer s.connected.Set(0)
	s.log.Info("engine kv events: connected", "endpoint", s.cfg.Endpoint)
	warned := false
	for {
		msg, err := sock.Recv()
		if err != nil {
			return true, err
		}
		if msg.Type == zmq4.CmdMsg {
			continue
		}
		if err := s.handle(msg.Frames); err != nil {
			s.bad.Inc()
			if !warned {
				warned = true
				s.log.Warn("engine kv events: undecodable message (is the endpoint an engine's --kv-events-config publisher?)",
					"endpoint", s.cfg.Endpoint, "err", err)
			} else {
				s.log.Debug("engine kv events: undecodable message", "err", err)
			}
		}
	}
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
// last is a new publisher (an engine numbers its batches from 0 when it starts); the first
// number read is the publisher's start if it is 0, else a gap (the node joined a stream under
// way).
func (s *Subscriber) sequence(seq uint64) (missed, restarted bool) {
	switch {
	case !s.haveLast:
		restarted, missed = seq == 0, seq != 0
	case seq <= s.last:
		restarted, missed = true, seq != 0
	case seq > s.last+1:
		missed = true
		s.gaps.Inc()
	}
	s.last, s.haveLast = seq, true
	return missed, restarted
}
