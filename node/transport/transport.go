package transport

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"
)

// Sentinel errors.
var (
	// ErrUnreachable wraps every Forward failure where nothing came back from the owner: dial,
	// handshake, stream open or a stream that died before the answer. The caller tries the next
	// peer.
	ErrUnreachable = errors.New("transport: peer unreachable")
	// ErrRejected is wrapped, with ErrUnreachable, when the owner reset the stream as a
	// protocol violation before answering. A node on frame version 1 answers every forward
	// from this version so, since it cannot read a version-2 header (it predates the refusals
	// of ErrVersion); a node on this version does so only for a body over its MaxBodyBytes or
	// a request slower than its RequestTimeout.
	ErrRejected = errors.New("transport: owner rejected the request frames (as a node on another frame version does)")
	// ErrTruncated is returned by Response.Body when the response ends without the owner's end
	// frame: the owner died, the connection timed out or the stream was reset.
	ErrTruncated = errors.New("transport: response truncated")
	// ErrRemote wraps the owner's own failure reported in the end frame.
	ErrRemote = errors.New("transport: owner failed")
	// ErrClosed is returned by a closed Transport and by a closed Response.Body.
	ErrClosed = errors.New("transport: closed")
	// ErrNotStarted is returned by Forward before Start.
	ErrNotStarted = errors.New("transport: not started")
	// ErrTooLarge is returned for a body over Config.MaxBodyBytes.
	ErrTooLarge = errors.New("transport: body too large")
	// ErrAnswered is returned by a ResponseWriter asked to answer twice or to write after a
	// refusal or the end.
	ErrAnswered = errors.New("transport: already answered")
)

// Application error codes on the wire.
const (
	codeShutdown  quic.ApplicationErrorCode = 1
	codeCancel    quic.StreamErrorCode      = 0x10
	codeProtocol  quic.StreamErrorCode      = 0x11
	codeNoHandler quic.StreamErrorCode      = 0x12
)

// Config configures a Transport.
type Config struct {
	// TLS is the node's config from LoadTLS (cloned; TLS 1.3 and ALPN are enforced).
	TLS *tls.Config
	// ListenAddr is the UDP address to serve on and dial from, e.g. "127.0.0.1:0".
	ListenAddr string
	// Handler serves inbound forwards; nil refuses every inbound stream.
	Handler Handler
	// KeepAlive is how long a connection may hear nothing before it pings the peer (quic-go
	// pings after this much silence, or half the IdleTimeout if that is shorter), so that a
	// live peer, even one with no stream open, is never silent for long. It must be below
	// IdleTimeout. Default 1s.
	KeepAlive time.Duration
	// IdleTimeout closes a connection that heard nothing for this long, failing its streams:
	// it is how a peer that died without closing anything (power loss, a partition) is
	// detected while a forward to it waits for its answer or reads its response. The two ends
	// use the shorter of their two values. A forward caught on such a connection ends at most
	// KeepAlive + IdleTimeout after the peer's last packet: the silence starts counting from
	// this side's last packet to the peer, its ping at the latest. One still waiting for its
	// answer then redials once (a dead connection is not yet a dead peer), which adds up to
	// HandshakeTimeout. Default 3s.
	IdleTimeout time.Duration
	// HandshakeTimeout bounds a dial including its TLS handshake (and an inbound handshake's
	// idle time). Default 500ms, sized for a LAN: a dial to a peer that died silently fails after
	// it, where quic-go's own default is 5s.
	HandshakeTimeout time.Duration
	// RequestTimeout bounds how long an inbound stream may take to deliver header and body.
	RequestTimeout time.Duration
	// MaxBodyBytes bounds a forwarded body, on both sides.
	MaxBodyBytes int
	// MaxStreams bounds concurrent inbound streams per connection.
	MaxStreams int
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// DefaultConfig returns the production defaults; TLS and Handler are left to the caller.
//
// KeepAlive and IdleTimeout bound how long a forward waits on a peer that vanished: at most
// 4 s (4.5 s with the one redial of a forward still waiting for its answer), against gossip's 3 s to call a silent peer stale (gossip.Config.StaleAfter) and the
// seconds memberlist's suspicion takes to declare it dead. The transport's own silence is the
// faster and the more direct evidence (gossip can be cut off while QUIC still flows), so
// in-flight forwards end by it, not by gossip. A live peer answers the pings within a
// round-trip and quic-go retransmits a lost one after its probe timeout, so only a peer that
// sent nothing for 3 s, on a LAN, is given up; quic-go also keeps the idle timeout at three
// probe timeouts or more, for slow paths.
func DefaultConfig() Config {
	return Config{
		ListenAddr:       ":7443",
		KeepAlive:        time.Second,
		IdleTimeout:      3 * time.Second,
		HandshakeTimeout: 500 * time.Millisecond,
		RequestTimeout:   10 * time.Second,
		MaxBodyBytes:     16 << 20,
		MaxStreams:       1024,
	}
}

// Transport is one node's QUIC endpoint: it serves forwards from peers and forwards to peers
// from the same UDP socket, with one connection per peer address.
type Transport struct {
	cfg       Config
	log       *slog.Logger
	m         *metrics
	serverTLS *tls.Config
	clientTLS *tls.Config
	serverQ   *quic.Config
	clientQ   *quic.Config

	mu       sync.Mutex
	started  bool
	closed   bool
	udp      *net.UDPConn
	qt       *quic.Transport
	ln       *quic.Listener
	peers    map[string]*peer
	conns    map[*quic.Conn]struct{}
	ctx      context.Context // cancelled by Close; parent of all serving work
	cancel   context.CancelFunc
	stopCtx  func() bool
	wg       sync.WaitGroup
	closeErr error
	// previous maps a peer address that refused a header of Version to when this stops
	// assuming it speaks PreviousVersion only, and older one that rejected a PreviousVersion
	// header's optional fields (a trace context, a queue TTL) to when this stops assuming it
	// cannot read them (Forward): during a rolling upgrade each forward to it then costs one
	// send, not two.
	previous, older sync.Map
}

// olderFor is how long a peer that refused Version is sent PreviousVersion, and one that
// rejected the optional fields headers without them.
const olderFor = time.Minute

// peer is the pooled connection to one address; ready is closed once the dial finished.
type peer struct {
	ready chan struct{}
	conn  *quic.Conn
	err   error
}

type hsKey struct{}

// hsState records whether an inbound connection passed verification.
type hsState struct{ ok atomic.Bool }

// New validates cfg and fills defaults; it does no I/O.
func New(cfg Config) (*Transport, error) {
	def := DefaultConfig()
	if cfg.TLS == nil {
		return nil, errors.New("transport: config: TLS is required")
	}
	if len(cfg.TLS.Certificates) == 0 {
		return nil, errors.New("transport: config: TLS has no certificate")
	}
	if cfg.TLS.RootCAs == nil || cfg.TLS.ClientCAs == nil {
		return nil, errors.New("transport: config: TLS needs the cluster CA as RootCAs and ClientCAs")
	}
	if cfg.TLS.InsecureSkipVerify {
		return nil, errors.New("transport: config: TLS must verify peers")
	}
	if cfg.ListenAddr == "" {
		cfg.ListenAddr = def.ListenAddr
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&cfg.KeepAlive, def.KeepAlive}, {&cfg.IdleTimeout, def.IdleTimeout}, {&cfg.HandshakeTimeout, def.HandshakeTimeout}, {&cfg.RequestTimeout, def.RequestTimeout}} {
		if *d.v < 0 {
			return nil, fmt.Errorf("transport: config: negative duration %v", *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if cfg.KeepAlive >= cfg.IdleTimeout {
		return nil, fmt.Errorf("transport: config: keep-alive %v must be below idle timeout %v", cfg.KeepAlive, cfg.IdleTimeout)
	}
	if cfg.MaxBodyBytes < 0 || cfg.MaxStreams < 0 {
		return nil, errors.New("transport: config: negative limit")
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = def.MaxBodyBytes
	}
	if cfg.MaxStreams == 0 {
		cfg.MaxStreams = def.MaxStreams
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("transport: metrics: %w", err)
	}
	base := cfg.TLS.Clone()
	base.MinVersion, base.MaxVersion = tls.VersionTLS13, tls.VersionTLS13
	base.NextProtos = []string{ALPN}
	base.ClientAuth = tls.RequireAndVerifyClientCert
	client := base.Clone()
	if client.ServerName == "" {
		client.ServerName = PeerServerName
	}
	t := &Transport{
		cfg:       cfg,
		log:       log,
		m:         m,
		serverTLS: base,
		clientTLS: client,
		peers:     make(map[string]*peer),
		conns:     make(map[*quic.Conn]struct{}),
	}
	// Each inbound handshake gets a config whose VerifyConnection marks it verified, so one
	// that fails (no cert, wrong CA, wrong ALPN) can be counted when its context ends.
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
	t.serverTLS = server
	t.serverQ = &quic.Config{
		HandshakeIdleTimeout:  cfg.HandshakeTimeout,
		MaxIdleTimeout:        cfg.IdleTimeout,
		KeepAlivePeriod:       cfg.KeepAlive,
		MaxIncomingStreams:    int64(cfg.MaxStreams),
		MaxIncomingUniStreams: -1,
	}
	t.clientQ = t.serverQ.Clone()
	// Streams flow from dialer to listener only; a peer may not open streams back on our dial.
	t.clientQ.MaxIncomingStreams = -1
	return t, nil
}

// Start binds the UDP socket and serves until Close or until ctx is cancelled.
func (t *Transport) Start(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ErrClosed
	}
	if t.started {
		return errors.New("transport: already started")
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("transport: start: %w", err)
	}
	ua, err := net.ResolveUDPAddr("udp", t.cfg.ListenAddr)
	if err != nil {
		return fmt.Errorf("transport: listen address: %w", err)
	}
	udp, err := net.ListenUDP("udp", ua)
	if err != nil {
		return fmt.Errorf("transport: listen: %w", err)
	}
	qt := &quic.Transport{
		Conn:              udp,
		StatelessResetKey: resetKey(t.cfg.TLS),
		ConnContext:       t.connContext,
	}
	ln, err := qt.Listen(t.serverTLS, t.serverQ)
	if err != nil {
		_ = qt.Close()
		_ = udp.Close()
		return fmt.Errorf("transport: listen: %w", err)
	}
	t.udp, t.qt, t.ln = udp, qt, ln
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.started = true
	t.wg.Add(2)
	go t.acceptLoop()
	go t.nonQUICLoop()
	t.stopCtx = context.AfterFunc(ctx, func() { _ = t.Close() })
	t.log.Info("transport listening", "addr", udp.LocalAddr().String())
	return nil
}

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

// Addr is the bound UDP address (nil before Start).
func (t *Transport) Addr() net.Addr {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.udp == nil {
		return nil
	}
	return t.udp.LocalAddr()
}

// Close closes every connection (peers see the close at once), cancels inbound handlers'
// contexts, waits for them to return (a handler must honour its ctx) and releases the
// socket. It is safe to call twice.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return t.closeErr
	}
	t.closed = true
	if !t.started {
		t.mu.Unlock()
		return nil
	}
	t.stopCtx()
	t.cancel()
	conns := make([]*quic.Conn, 0, len(t.conns))
	for c := range t.conns {
		conns = append(conns, c)
	}
	t.mu.Unlock()

	for _, c := range conns {
		_ = c.CloseWithError(codeShutdown, "node shutting down")
	}
	err := t.ln.Close()
	t.wg.Wait()
	if e := t.qt.Close(); e != nil && err == nil {
		err = e
	}
	if e := t.udp.Close(); e != nil && !errors.Is(e, net.ErrClosed) && err == nil {
		err = e
	}
	if err != nil {
		err = fmt.Errorf("transport: close: %w", err)
	}
	t.mu.Lock()
	t.closeErr = err
	t.mu.Unlock()
	return err
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

// Response is the owner's accepted answer.
type Response struct {
	Status  int
	Headers map[string]string
	// Body yields the owner's data bytes as they arrive. It returns io.EOF after the owner's
	// clean end, an error wrapping ErrRemote if the owner reported a failure, and one wrapping
	// ErrTruncated if the stream ended any other way. Closing it early cancels the stream and
	// the owner's work.
	Body io.ReadCloser
}

// Forward sends h and body to the owner at addr and waits for its answer. A refusal is
// returned as a *Refusal error; failure before any answer wraps ErrUnreachable (or is ctx's
// error when ctx ended). Cancelling ctx at any time, also while reading Body, cancels the
// stream so the owner's request context is cancelled. A forward whose pooled connection
// proves dead before the answer (the owner restarted or forgot it, or this host was frozen
// past the idle timeout) is sent once more on a new connection, and counted in
// kvmesh_transport_redials_total; only the second send's failure is the caller's.
//
// A header of Version (h.Version zero) that the owner refuses as of another version
// (ErrVersion: a peer that speaks PreviousVersion only) is sent once more in PreviousVersion,
// and so is every forward to that peer for a minute after. In PreviousVersion, a header with a
// trace context or a queue TTL that the owner resets as malformed (ErrRejected) is sent once
// more without them: a peer of that version built before Header.TraceParent or
// Header.QueueTTL cannot read them, and runs the request untraced and unbounded. A header with
// a Resume, Prefill or a Handover is not sent again for its trace context: no peer that
// rejects it can run the continuation or the half as one, so the error is the caller's, to try
// another. It is sent again for its queue TTL, which came after them: a peer built between the
// two runs the half. A peer that read the header sent again is sent none of them for a minute.
func (t *Transport) Forward(ctx context.Context, addr string, h Header, body []byte) (*Response, error) {
	if until, ok := t.previous.Load(addr); h.Version == 0 && ok {
		if time.Now().Before(until.(time.Time)) {
			h.Version = PreviousVersion
		} else {
			t.previous.Delete(addr)
		}
	}
	resp, result, err := t.forwardPrevious(ctx, addr, h, body)
	if h.Version == 0 && errors.Is(err, ErrVersion) && ctx.Err() == nil {
		t.m.streams.WithLabelValues(dirOut, result).Inc()
		t.log.Debug("transport: owner refused the frame version; forwarding in the previous one", "request_id", h.RequestID, "addr", addr)
		h.Version = PreviousVersion
		resp, result, err = t.forwardPrevious(ctx, addr, h, body)
		if !errors.Is(err, ErrVersion) {
			t.previous.Store(addr, time.Now().Add(olderFor)) // it reads the previous version
		}
	}
	t.m.streams.WithLabelValues(dirOut, result).Inc()
	if err != nil && result != resultRefused {
		t.log.Debug("transport: forward failed", "request_id", h.RequestID, "addr", addr, "err", err)
	}
	return resp, err
}

// forwardPrevious is forward, and for a PreviousVersion header the second send without the
// fields its peers built before them reset (Forward); it counts the first of two sends.
func (t *Transport) forwardPrevious(ctx context.Context, addr string, h Header, body []byte) (*Response, string, error) {
	if h.Version != PreviousVersion {
		return t.forward(ctx, addr, h, body)
	}
	optional := h.QueueTTL != 0 || h.TraceParent != "" && h.Resume == nil && !h.Prefill && h.Handover == nil
	strip := func() { h.TraceParent, h.TraceState, h.QueueTTL, h.QueueTTLLeft = "", "", 0, 0 }
	if until, ok := t.older.Load(addr); optional && ok {
		if time.Now().Before(until.(time.Time)) {
			strip()
			optional = false
		} else {
			t.older.Delete(addr)
		}
	}
	resp, result, err := t.forward(ctx, addr, h, body)
	if optional && errors.Is(err, ErrRejected) && ctx.Err() == nil {
		t.m.streams.WithLabelValues(dirOut, result).Inc()
		t.log.Debug("transport: owner rejected a trace context or queue TTL; forwarding without them", "request_id", h.RequestID, "addr", addr)
		strip()
		resp, result, err = t.forward(ctx, addr, h, body)
		if !errors.Is(err, ErrRejected) {
			t.older.Store(addr, time.Now().Add(olderFor)) // it reads the header without them
		}
	}
	return resp, result, err
}

// canceler is the part of a stream respBody needs besides reading (a seam for the fuzz test).
type canceler interface {
	CancelRead(quic.StreamErrorCode)
	CancelWrite(quic.StreamErrorCode)
}

// respBody relays data frames to the reader; it is not safe for concurrent Reads, but Close
// may be called concurrently with a Read to abort it.
type respBody struct {
	str    canceler
	br     *bufio.Reader
	stop   func() bool
	ctxErr func() error // the Forward context's Err, to report a cancel as such
	closed atomic.Bool
	remain int
	err    error
}

func (b *respBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	for b.remain == 0 {
		typ, n, err := readFrameHead(b.br)
		if err != nil {
			return 0, b.fail(err)
		}
		switch typ {
		case frameData:
			b.remain = n
		case frameEnd:
			if n > MaxAnswerBytes {
				return 0, b.fail(fmt.Errorf("%w: end frame of %d bytes", ErrMalformed, n))
			}
			buf := make([]byte, n)
			if _, err := io.ReadFull(b.br, buf); err != nil {
				return 0, b.fail(err)
			}
			msg, err := decodeEnd(buf)
			if err != nil {
				return 0, b.fail(err)
			}
			b.stop()
			// Done: release the receive side now rather than when (or if) Body is closed.
			b.str.CancelRead(codeCancel)
			if msg != "" {
				b.err = fmt.Errorf("%w: %s", ErrRemote, msg)
			} else {
				b.err = io.EOF
			}
			return 0, b.err
		default:
			return 0, b.fail(fmt.Errorf("%w: frame type %d in a response", ErrMalformed, typ))
		}
	}
	if len(p) > b.remain {
		p = p[:b.remain]
	}
	n, err := b.br.Read(p)
	b.remain -= n
	if err != nil {
		return n, b.fail(err)
	}
	return n, nil
}

// fail turns a read error into the Body's terminal error and cancels the stream.
func (b *respBody) fail(err error) error {
	b.stop()
	b.str.CancelRead(codeCancel)
	b.str.CancelWrite(codeCancel)
	switch {
	case b.closed.Load():
		b.err = ErrClosed
	case b.ctxErr() != nil:
		b.err = fmt.Errorf("transport: response: %w", b.ctxErr())
	default:
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		b.err = fmt.Errorf("%w: %w", ErrTruncated, err)
	}
	return b.err
}

// Close cancels the stream unless the response already ended; safe to call twice.
func (b *respBody) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	b.stop()
	b.str.CancelRead(codeCancel)
	b.str.CancelWrite(codeCancel)
	return nil
}
