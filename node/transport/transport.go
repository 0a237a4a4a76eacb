package transport

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

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

// New validates cfg and fills defaults; it does no I/O.
func New(cfg Config) (*Transport, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
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
	t.serverTLS = verifyingServerTLS(base)
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
	conns := make([]*quic.Conn, 0, len(t.conns))
	for c := range t.conns {
		conns = append(conns, c)
	}
	t.mu.Unlock()

	// Connections close before handlers' contexts end: a handler that returns on its cancelled
	// context then cannot end its stream cleanly, which the peer would take for a whole answer.
	for _, c := range conns {
		_ = c.CloseWithError(codeShutdown, "node shutting down")
	}
	t.cancel()
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
