package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// MaxFrameBytes bounds one ZMTP frame from a publisher: zmq4 allocates a frame's whole
// announced length before reading it, so a larger one ends the connection instead. An engine's
// batch holds one step's events (its token ids included), far less.
const MaxFrameBytes = 64 << 20

// handshakeTimeout bounds the ZMTP greeting and handshake of a dialled publisher.
const handshakeTimeout = 5 * time.Second

// guardedScheme is the zmq4 transport the subscriber dials through: TCP with frameGuard.
const guardedScheme = "kvmesh-tcp"

var registerOnce sync.Once

func registerGuarded() {
	registerOnce.Do(func() {
		_ = zmq4.RegisterTransport(guardedScheme, guardedTCP{inner: transport.New("tcp")})
	})
}

// ErrEndpoint is returned for an endpoint that is not tcp://host:port (or, for a subscriber,
// bind:tcp://host:port).
var ErrEndpoint = errors.New("kvevents: endpoint must be tcp://host:port")

// BindPrefix marks a subscriber's endpoint that it binds, for a publisher that dials it:
// bind:tcp://*:5557.
const BindPrefix = "bind:"

// parseEndpoint checks a tcp://host:port endpoint and returns host:port. A subscriber dials
// it, so its host must be an address (not vLLM's bind-all "*") and its port not 0.
func parseEndpoint(ep string, dial bool) (string, error) {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", fmt.Errorf("%w: %q", ErrEndpoint, ep)
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return "", fmt.Errorf("%w: %q: %w", ErrEndpoint, ep, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 || (dial && p == 0) {
		return "", fmt.Errorf("%w: %q: bad port", ErrEndpoint, ep)
	}
	if dial && (host == "" || host == "*") {
		return "", fmt.Errorf("%w: %q: name the engine's host, e.g. tcp://127.0.0.1:%s (or bind:tcp://*:%s for a publisher that dials)",
			ErrEndpoint, ep, port, port)
	}
	return net.JoinHostPort(host, port), nil
}

// connHooks are told of each publisher's connection a bound subscriber accepts: ready once
// its ZMTP handshake is through, gone when it ends (only after ready). zmq4 hands the
// transport only its socket's context, so the hooks travel in it (withHooks).
type connHooks struct {
	ready, gone func(remote net.Addr)
}

type hooksKey struct{}

func withHooks(ctx context.Context, h *connHooks) context.Context {
	return context.WithValue(ctx, hooksKey{}, h)
}

// guardedTCP is zmq4's TCP transport with each connection, dialled or accepted, wrapped in a
// frameGuard.
type guardedTCP struct{ inner transport.Transport }

func (g guardedTCP) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := g.inner.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	return guard(ctx, c, nil), nil
}

func (g guardedTCP) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := g.inner.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	h, _ := ctx.Value(hooksKey{}).(*connHooks)
	return guardedListener{Listener: l, ctx: ctx, hooks: h}, nil
}

func (g guardedTCP) Addr(ep string) (string, error) { return g.inner.Addr(ep) }

// guardedListener wraps each accepted connection in a frameGuard. zmq4 runs the handshake of
// each accepted connection in its accept loop, one at a time, so the guard's handshake
// deadline also keeps a peer that connects and says nothing from holding the port.
type guardedListener struct {
	net.Listener
	ctx   context.Context
	hooks *connHooks
}

func (l guardedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return guard(l.ctx, c, l.hooks), nil
}

// guard wraps c in a frameGuard whose handshake is bounded in time, and closes c when ctx
// ends.
func guard(ctx context.Context, c net.Conn, h *connHooks) *frameGuard {
	_ = c.SetReadDeadline(time.Now().Add(handshakeTimeout))
	fg := &frameGuard{Conn: c, skip: 64, hooks: h} // the ZMTP 3 greeting is 64 bytes
	// zmq4 reads the handshake without a context: closing the socket's context closes the
	// connection, so neither a silent peer nor Close leaves a read blocked.
	stopCtx := context.AfterFunc(ctx, func() { c.Close() })
	// Nor does zmq4 close a connection whose handshake failed: one not through it in time is
	// closed here.
	timer := time.AfterFunc(handshakeTimeout, func() {
		fg.hookMu.Lock()
		defer fg.hookMu.Unlock()
		if !fg.handshook {
			c.Close()
		}
	})
	fg.stop = func() {
		stopCtx()
		timer.Stop()
	}
	return fg
}

var errFrameTooLarge = fmt.Errorf("kvevents: a publisher's frame is larger than %d bytes", MaxFrameBytes)

// frameGuard follows the ZMTP framing of what it reads (after the greeting: a flags byte, a
// 1- or 8-byte length, the body) and fails the read that would hand zmq4 a length above
// MaxFrameBytes. The read deadline of the handshake is lifted after the first frame (the
// peer's READY).
type frameGuard struct {
	net.Conn
	stop  func()
	hooks *connHooks // nil: none
	// hookMu guards handshook and closed, and orders the hooks: gone follows ready, once,
	// and nothing follows Close.
	hookMu            sync.Mutex
	handshook, closed bool
	skip              int     // bytes of greeting or frame body still to pass
	hdr               [9]byte // the frame header being read
	hdrLen            int
	frames            int
}

func (g *frameGuard) Read(p []byte) (int, error) {
	n, err := g.Conn.Read(p)
	if ferr := g.follow(p[:n]); ferr != nil {
		g.Conn.Close()
		return 0, ferr
	}
	return n, err
}

// follow advances the framing over b.
func (g *frameGuard) follow(b []byte) error {
	for len(b) > 0 {
		if g.skip > 0 {
			k := min(g.skip, len(b))
			g.skip -= k
			b = b[k:]
			if g.skip == 0 && g.hdrLen > 0 {
				g.frameDone()
			}
			continue
		}
		g.hdr[g.hdrLen] = b[0]
		g.hdrLen++
		b = b[1:]
		need := 2
		if g.hdr[0]&0x02 != 0 { // a long frame
			need = 9
		}
		if g.hdrLen < need {
			continue
		}
		size := uint64(g.hdr[1])
		if need == 9 {
			size = binary.BigEndian.Uint64(g.hdr[1:9])
		}
		if size > MaxFrameBytes {
			return errFrameTooLarge
		}
		g.skip = int(size)
		if size == 0 {
			g.frameDone()
		}
	}
	return nil
}

func (g *frameGuard) frameDone() {
	g.hdrLen = 0
	g.frames++
	if g.frames == 1 {
		_ = g.Conn.SetReadDeadline(time.Time{})
		g.hookMu.Lock()
		if !g.closed {
			g.handshook = true
			if g.hooks != nil {
				g.hooks.ready(g.RemoteAddr())
			}
		}
		g.hookMu.Unlock()
	}
}

func (g *frameGuard) Close() error {
	g.stop()
	g.hookMu.Lock()
	if !g.closed && g.handshook && g.hooks != nil {
		g.hooks.gone(g.RemoteAddr())
	}
	g.closed = true
	g.hookMu.Unlock()
	return g.Conn.Close()
}
