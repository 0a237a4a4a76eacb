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

// ErrEndpoint is returned for an endpoint that is not tcp://host:port.
var ErrEndpoint = errors.New("kvevents: endpoint must be tcp://host:port")

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
		return "", fmt.Errorf("%w: %q: name the engine's host, e.g. tcp://127.0.0.1:%s", ErrEndpoint, ep, port)
	}
	return net.JoinHostPort(host, port), nil
}

// guardedTCP is zmq4's TCP transport with each dialled connection wrapped in a frameGuard.
type guardedTCP struct{ inner transport.Transport }

func (g guardedTCP) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := g.inner.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	_ = c.SetReadDeadline(time.Now().Add(handshakeTimeout))
	fg := &frameGuard{Conn: c, skip: 64} // the ZMTP 3 greeting is 64 bytes
	// zmq4 reads the handshake without a context: closing the socket's context closes the
	// connection, so neither a silent peer nor Close leaves a read blocked.
	fg.stop = context.AfterFunc(ctx, func() { c.Close() })
	return fg, nil
}

func (g guardedTCP) Listen(ctx context.Context, addr string) (net.Listener, error) {
	return g.inner.Listen(ctx, addr)
}

func (g guardedTCP) Addr(ep string) (string, error) { return g.inner.Addr(ep) }

var errFrameTooLarge = fmt.Errorf("kvevents: a publisher's frame is larger than %d bytes", MaxFrameBytes)

// frameGuard follows the ZMTP framing of what it reads (after the greeting: a flags byte, a
// 1- or 8-byte length, the body) and fails the read that would hand zmq4 a length above
// MaxFrameBytes. The read deadline of the handshake is lifted after the first frame (the
// publisher's READY).
type frameGuard struct {
	net.Conn
	stop   func() bool
	skip   int     // bytes of greeting or frame body still to pass
	hdr    [9]byte // the frame header being read
	hdrLen int
	frames int
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
	}
}

func (g *frameGuard) Close() error {
	g.stop()
	return g.Conn.Close()
}
