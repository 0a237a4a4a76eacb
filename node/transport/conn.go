package transport

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
)

type hsKey struct{}

// hsState records whether an inbound connection passed verification.
type hsState struct{ ok atomic.Bool }

// resetKey derives the stateless reset key from the node's private key, so a restarted node
// resets its peers' stale connections at once instead of leaving them to the idle timeout.
func resetKey(c *tls.Config) *quic.StatelessResetKey {
	der, err := x509.MarshalPKCS8PrivateKey(c.Certificates[0].PrivateKey)
	if err != nil {
		return nil
	}
	k := quic.StatelessResetKey(sha256.Sum256(append([]byte("kvmesh stateless reset\x00"), der...)))
	return &k
}

// track registers c until it closes; false when the transport is already closing.
func (t *Transport) track(c *quic.Conn, dir string) bool {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return false
	}
	t.conns[c] = struct{}{}
	t.mu.Unlock()
	t.m.conns.WithLabelValues(dir).Inc()
	context.AfterFunc(c.Context(), func() {
		t.mu.Lock()
		delete(t.conns, c)
		t.mu.Unlock()
		t.m.conns.WithLabelValues(dir).Dec()
	})
	return true
}

func (t *Transport) connContext(ctx context.Context, _ *quic.ClientInfo) (context.Context, error) {
	st := &hsState{}
	context.AfterFunc(ctx, func() {
		if !st.ok.Load() {
			t.m.rejected.WithLabelValues(reasonHandshake).Inc()
		}
	})
	return context.WithValue(ctx, hsKey{}, st), nil
}

func (t *Transport) nonQUICLoop() {
	defer t.wg.Done()
	buf := make([]byte, 2048)
	for {
		_, from, err := t.qt.ReadNonQUICPacket(t.ctx, buf)
		if err != nil {
			return
		}
		t.m.rejected.WithLabelValues(reasonNotQUIC).Inc()
		t.log.Debug("transport: dropped non-quic datagram", "from", from.String())
	}
}

// conn returns the pooled connection to addr, dialing it if there is none or it died. Callers
// racing on a first use share one dial; the dial is not bound to any one caller's context so
// that one cancelled request does not fail the others waiting on it.
func (t *Transport) conn(ctx context.Context, addr string) (*quic.Conn, error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, ErrClosed
	}
	if !t.started {
		t.mu.Unlock()
		return nil, ErrNotStarted
	}
	p := t.peers[addr]
	if p != nil {
		select {
		case <-p.ready:
			if p.err != nil || p.conn.Context().Err() != nil {
				delete(t.peers, addr)
				p = nil
			}
		default:
		}
	}
	if p == nil {
		p = &peer{ready: make(chan struct{})}
		t.peers[addr] = p
		t.wg.Add(1)
		go t.dial(addr, p)
	}
	t.mu.Unlock()
	select {
	case <-p.ready:
		return p.conn, p.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (t *Transport) dial(addr string, p *peer) {
	defer t.wg.Done()
	defer close(p.ready)
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		p.err = fmt.Errorf("%w: %s: %w", ErrUnreachable, addr, err)
		t.m.dialErrors.Inc()
		return
	}
	ctx, cancel := context.WithTimeout(t.ctx, t.cfg.HandshakeTimeout)
	defer cancel()
	c, err := t.qt.Dial(ctx, ua, t.clientTLS, t.clientQ)
	if err != nil {
		p.err = fmt.Errorf("%w: dial %s: %w", ErrUnreachable, addr, err)
		t.m.dialErrors.Inc()
		t.log.Debug("transport: dial failed", "addr", addr, "err", err)
		return
	}
	if !t.track(c, dirOut) {
		_ = c.CloseWithError(codeShutdown, "node shutting down")
		p.err = ErrClosed
		return
	}
	p.conn = c
}

// peerReason returns why the owner stopped a write that failed with err. An owner that resets
// a stream stops its reading and ends its writing with the same code; which of the two reaches
// this side first is a race, and a Close after the first one fails with a local "canceled
// stream" error that names no reason. The reset of the owner's writing does: it is read here,
// for a second at most.
func peerReason(str *quic.Stream, err error) error {
	if se := (*quic.StreamError)(nil); errors.As(err, &se) && se.Remote {
		return err
	}
	_ = str.SetReadDeadline(time.Now().Add(time.Second))
	if _, rerr := str.Read(make([]byte, 1)); rerr != nil {
		if se := (*quic.StreamError)(nil); errors.As(rerr, &se) && se.Remote {
			return rerr
		}
	}
	return err
}

// forget drops addr's pooled connection if it is still c.
func (t *Transport) forget(addr string, c *quic.Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.peers[addr]; p != nil {
		select {
		case <-p.ready:
			if p.conn == c {
				delete(t.peers, addr)
			}
		default:
		}
	}
}

// verifyingServerTLS returns base for inbound handshakes, with a GetConfigForClient that gives
// each handshake a config whose VerifyConnection marks it verified, so one that fails (no
// cert, wrong CA, wrong ALPN) can be counted when its context ends.
func verifyingServerTLS(base *tls.Config) *tls.Config {
	prev := base.GetConfigForClient
	server := base.Clone()
	server.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		c := base
		if prev != nil {
			pc, err := prev(hello)
			if err != nil {
				return nil, err
			}
			if pc != nil {
				c = pc
			}
		}
		st, _ := hello.Context().Value(hsKey{}).(*hsState)
		if st == nil {
			return nil, nil
		}
		c = c.Clone()
		verify := c.VerifyConnection
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			if verify != nil {
				if err := verify(cs); err != nil {
					return err
				}
			}
			st.ok.Store(true)
			return nil
		}
		return c, nil
	}
	return server
}
