package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Endpoint is the address to listen on, tcp://host:port (tcp://*:5557 listens on every
	// interface; port 0 picks a free one). Required.
	Endpoint string
	// Topic is every message's first frame; "" by default, as vLLM's.
	Topic string
	// HWM is how many messages may wait for slow subscribers before new ones are dropped.
	// Default 10,000.
	HWM int
}

// Publisher publishes KV cache events in the engines' format: one message per Publish,
// [topic, 8-byte big-endian sequence number from 0, EncodeBatch payload]. It is safe for
// concurrent use; Publish never blocks on a subscriber.
type Publisher struct {
	cfg  PublisherConfig
	addr string

	mu     sync.Mutex
	sock   zmq4.Socket
	seq    uint64
	closed bool
}

// NewPublisher validates cfg. It does no I/O.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	addr, err := parseEndpoint(cfg.Endpoint, false)
	if err != nil {
		return nil, err
	}
	if cfg.HWM < 0 {
		return nil, errors.New("kvevents: negative HWM")
	}
	if cfg.HWM == 0 {
		cfg.HWM = 10_000
	}
	return &Publisher{cfg: cfg, addr: addr}, nil
}

// Start listens on the endpoint.
func (p *Publisher) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sock != nil || p.closed {
		return errors.New("kvevents: publisher already started or closed")
	}
	sock := zmq4.NewPub(context.Background(), zmq4.WithLogger(log.New(io.Discard, "", 0)))
	_ = sock.SetOption(zmq4.OptionHWM, p.cfg.HWM) // a PUB socket takes it
	if err := sock.Listen("tcp://" + p.addr); err != nil {
		sock.Close()
		return fmt.Errorf("kvevents: %w", err)
	}
	p.sock = sock
	return nil
}

// Addr is the bound endpoint, tcp://host:port ("" before Start).
func (p *Publisher) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sock == nil || p.sock.Addr() == nil {
		return ""
	}
	return "tcp://" + p.sock.Addr().String()
}

// Publish sends events as one batch; it does nothing before Start, after Close, or for no
// events.
func (p *Publisher) Publish(events ...Event) {
	if len(events) == 0 {
		return
	}
	payload := EncodeBatch(time.Now(), events)
	p.mu.Lock()
	defer p.mu.Unlock()
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], p.seq)
	if p.sendLocked([]byte(p.cfg.Topic), seq[:], payload) {
		p.seq++
	}
}

// sendLocked sends one message of frames, unless the publisher is not started or closed.
func (p *Publisher) sendLocked(frames ...[]byte) bool {
	if p.sock == nil || p.closed {
		return false
	}
	// A PUB socket queues the message (dropping it past HWM) and returns.
	_ = p.sock.SendMulti(zmq4.NewMsgFrom(frames...))
	return true
}

// Close stops listening; it is safe twice and before Start. zmq4's PUB socket leaves its
// writer goroutine parked after Close (the socket never closes it): one idle goroutine per
// Publisher, for the life of the process.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.sock == nil {
		p.closed = true
		return nil
	}
	p.closed = true
	return p.sock.Close()
}

// LeakedWriter is the function of the goroutine a closed Publisher leaves (see Close), for
// tests' leak checks to ignore.
const LeakedWriter = "github.com/go-zeromq/zmq4.(*pubMWriter).run"
