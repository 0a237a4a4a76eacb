package transport

import (
	"bufio"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
)

// Handler serves one forwarded request on the owner.
type Handler interface {
	// ServeForward answers h and body through w: Refuse, or Accept then Write. Returning ends
	// the response (with Fail's error if it was called). ctx is cancelled when the ingress
	// cancels the stream, the connection dies or the Transport closes. h is of this frame
	// version and of a known Kind (others are refused before any handler runs). h.Deadline is
	// advisory: the handler decides whether to honour it.
	ServeForward(ctx context.Context, h Header, body []byte, w ResponseWriter)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, h Header, body []byte, w ResponseWriter)

// ServeForward calls f.
func (f HandlerFunc) ServeForward(ctx context.Context, h Header, body []byte, w ResponseWriter) {
	f(ctx, h, body, w)
}

// ResponseWriter is the owner's side of a forward stream. Its methods are safe for concurrent
// use, but the order of answers is the handler's to keep.
type ResponseWriter interface {
	// Refuse answers no, before any Accept; it ends the stream.
	Refuse(r Refusal) error
	// Accept answers yes with an HTTP status and headers.
	Accept(status int, headers map[string]string) error
	// Write sends p as data frames at once (implicitly Accept(200, nil) first).
	Write(p []byte) (int, error)
	// Fail ends the stream with err: an error end frame after Accept, a 502 refusal before.
	Fail(err error) error
}

func (t *Transport) acceptLoop() {
	defer t.wg.Done()
	for {
		c, err := t.ln.Accept(t.ctx)
		if err != nil {
			return
		}
		if !t.track(c, dirIn) {
			_ = c.CloseWithError(codeShutdown, "node shutting down")
			return
		}
		t.wg.Add(1)
		go t.serveConn(c)
	}
}

func (t *Transport) serveConn(c *quic.Conn) {
	defer t.wg.Done()
	for {
		str, err := c.AcceptStream(t.ctx)
		if err != nil {
			return
		}
		t.wg.Add(1)
		go t.serveStream(c, str)
	}
}

// drop rejects a stream the peer got wrong, counting why.
func (t *Transport) drop(c *quic.Conn, str *quic.Stream, reason string, code quic.StreamErrorCode, err error) {
	t.m.rejected.WithLabelValues(reason).Inc()
	t.log.Debug("transport: dropped stream", "reason", reason, "peer", c.RemoteAddr().String(), "err", err)
	str.CancelRead(code)
	str.CancelWrite(code)
}

// refuseHeader answers a header this node cannot read (another version, an unknown kind) with
// r, counting why: a refusal rather than a reset, so the ingress can tell what went wrong.
func (t *Transport) refuseHeader(c *quic.Conn, str *quic.Stream, br *bufio.Reader, reason string, r Refusal) {
	t.m.rejected.WithLabelValues(reason).Inc()
	t.log.Debug("transport: refused stream", "reason", reason, "peer", c.RemoteAddr().String(), "err", r.Message)
	// The body is read and dropped first: an ingress still writing it when the refusal stops
	// the read side would see that stop instead of the refusal.
	if typ, n, err := readFrameHead(br); err == nil && typ == frameBody && n <= t.cfg.MaxBodyBytes {
		_, _ = io.CopyN(io.Discard, br, int64(n))
	}
	w := &responseWriter{t: t, str: str}
	_ = w.Refuse(r)
}

func (t *Transport) serveStream(c *quic.Conn, str *quic.Stream) {
	defer t.wg.Done()
	if t.cfg.Handler == nil {
		t.drop(c, str, reasonNoHandler, codeNoHandler, nil)
		return
	}
	// A peer gets RequestTimeout to deliver the whole request, so a stalled stream cannot pin
	// a goroutine and its buffers.
	_ = str.SetReadDeadline(time.Now().Add(t.cfg.RequestTimeout))
	br := bufio.NewReaderSize(str, 16<<10)
	typ, p, err := readFrame(br, MaxHeaderBytes)
	if err == nil && typ != frameHeader {
		err = fmt.Errorf("%w: stream starts with frame type %d", ErrMalformed, typ)
	}
	var h Header
	if err == nil {
		h, err = DecodeHeader(p)
	}
	switch {
	case errors.Is(err, ErrVersion):
		t.refuseHeader(c, str, br, reasonVersion, Refusal{Status: StatusVersion, Code: CodeVersion, Message: err.Error()})
		return
	case errors.Is(err, ErrKind):
		t.refuseHeader(c, str, br, reasonKind, Refusal{Status: StatusKind, Code: CodeKind, Message: err.Error()})
		return
	case err != nil:
		t.drop(c, str, reasonHeader, codeProtocol, err)
		return
	}
	typ, body, err := readFrame(br, t.cfg.MaxBodyBytes)
	if err == nil && typ != frameBody {
		err = fmt.Errorf("%w: frame type %d instead of the body", ErrMalformed, typ)
	}
	if err == nil {
		// The request is complete only at the stream's end; anything more is a protocol error.
		if _, e := br.ReadByte(); e != io.EOF {
			err = fmt.Errorf("%w: data after the body (%v)", ErrMalformed, e)
		}
	}
	if err != nil {
		t.drop(c, str, reasonBody, codeProtocol, err)
		return
	}

	// The send side's context ends when the ingress stops reading (cancel) or the connection
	// dies; Close ends t.ctx.
	ctx, cancel := context.WithCancelCause(context.WithValue(t.ctx, peerKey{}, peerCert(c)))
	stop := context.AfterFunc(str.Context(), func() { cancel(errors.New("transport: ingress cancelled the stream")) })
	w := &responseWriter{t: t, str: str}
	defer func() {
		stop()
		cancel(nil)
		if r := recover(); r != nil {
			t.log.Error("transport: handler panicked", "request_id", h.RequestID, "panic", r)
			_ = w.Fail(errors.New("handler panic"))
		}
		w.finish()
	}()
	t.cfg.Handler.ServeForward(ctx, h, body, w)
}

type peerKey struct{}

// peerCert is the certificate c's peer verified with (nil without one).
func peerCert(c *quic.Conn) *x509.Certificate {
	if pc := c.ConnectionState().TLS.PeerCertificates; len(pc) > 0 {
		return pc[0]
	}
	return nil
}

// PeerName is, in a ServeForward context, the name in the certificate of the peer that sent
// the forward and whether that certificate is issued for any node (CertName); ok is false
// elsewhere. The handler compares it with the name the header claims (Header.Ingress).
func PeerName(ctx context.Context) (name string, anyNode, ok bool) {
	c, _ := ctx.Value(peerKey{}).(*x509.Certificate)
	if c == nil {
		return "", false, false
	}
	name, anyNode = CertName(c)
	return name, anyNode, true
}

type writerState uint8

const (
	stateNew writerState = iota
	stateAccepted
	stateDone
)

type responseWriter struct {
	t     *Transport
	str   *quic.Stream
	mu    sync.Mutex
	state writerState
	buf   []byte
}

var _ ResponseWriter = (*responseWriter)(nil)

func (w *responseWriter) sendLocked(typ byte, p []byte) error {
	w.buf = appendFrameHead(w.buf[:0], typ, len(p))
	if len(p) <= 16<<10 {
		w.buf = append(w.buf, p...)
		p = nil
	}
	if _, err := w.str.Write(w.buf); err != nil {
		return w.brokenLocked(err)
	}
	if len(p) > 0 {
		if _, err := w.str.Write(p); err != nil {
			return w.brokenLocked(err)
		}
	}
	return nil
}

func (w *responseWriter) brokenLocked(err error) error {
	w.state = stateDone
	w.str.CancelRead(codeCancel)
	w.str.CancelWrite(codeCancel)
	return fmt.Errorf("transport: write response: %w", err)
}

func (w *responseWriter) Refuse(r Refusal) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state != stateNew {
		return ErrAnswered
	}
	return w.refuseLocked(r)
}

func (w *responseWriter) refuseLocked(r Refusal) error {
	p, err := encodeRefuse(r)
	if err != nil {
		return err
	}
	w.t.m.streams.WithLabelValues(dirIn, resultRefused).Inc()
	if err := w.sendLocked(frameRefuse, p); err != nil {
		return err
	}
	w.state = stateDone
	w.str.CancelRead(codeCancel)
	return w.closeLocked()
}

func (w *responseWriter) Accept(status int, headers map[string]string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.acceptLocked(status, headers)
}

func (w *responseWriter) acceptLocked(status int, headers map[string]string) error {
	if w.state != stateNew {
		return ErrAnswered
	}
	p, err := encodeAccept(status, headers)
	if err != nil {
		return err
	}
	w.t.m.streams.WithLabelValues(dirIn, resultAccepted).Inc()
	if err := w.sendLocked(frameAccept, p); err != nil {
		return err
	}
	w.state = stateAccepted
	return nil
}

func (w *responseWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state == stateNew {
		if err := w.acceptLocked(http.StatusOK, nil); err != nil {
			return 0, err
		}
	}
	if w.state != stateAccepted {
		return 0, ErrAnswered
	}
	n := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), MaxDataFrameBytes)]
		if err := w.sendLocked(frameData, chunk); err != nil {
			return n, err
		}
		n += len(chunk)
		p = p[len(chunk):]
	}
	return n, nil
}

func (w *responseWriter) Fail(err error) error {
	msg := "owner failed"
	if err != nil && err.Error() != "" {
		msg = err.Error()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch w.state {
	case stateNew:
		return w.refuseLocked(Refusal{Status: http.StatusBadGateway, Code: "owner_failed", Message: msg})
	case stateAccepted:
		return w.endLocked(msg)
	default:
		return ErrAnswered
	}
}

func (w *responseWriter) endLocked(failure string) error {
	err := w.sendLocked(frameEnd, encodeEnd(failure))
	if err != nil {
		return err
	}
	w.state = stateDone
	return w.closeLocked()
}

func (w *responseWriter) closeLocked() error {
	if err := w.str.Close(); err != nil {
		return fmt.Errorf("transport: close response: %w", err)
	}
	return nil
}

// finish ends the stream after the handler returned, cleanly if it was accepted.
func (w *responseWriter) finish() {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch w.state {
	case stateNew:
		_ = w.refuseLocked(Refusal{Status: http.StatusBadGateway, Code: "no_response", Message: "owner returned no answer"})
	case stateAccepted:
		_ = w.endLocked("")
	}
	// The request side was read to its end; this only releases it if the handler bailed early.
	w.str.CancelRead(codeCancel)
}

// HTTPResponseWriter adapts w so ordinary net/http handler code can serve a forward: the first
// WriteHeader (or Write, as 200) becomes Accept with the headers set so far (repeated values
// joined by ", "), and every Write is relayed at once, so Flush has nothing left to do.
// 1xx statuses are not relayed. The content type is not sniffed.
func HTTPResponseWriter(w ResponseWriter) http.ResponseWriter {
	return &httpWriter{w: w, hdr: make(http.Header)}
}

type httpWriter struct {
	w     ResponseWriter
	hdr   http.Header
	wrote bool
	err   error
}

var _ http.Flusher = (*httpWriter)(nil)

func (h *httpWriter) Header() http.Header { return h.hdr }

func (h *httpWriter) WriteHeader(status int) {
	if h.wrote || (status >= 100 && status < 200) {
		return
	}
	h.wrote = true
	m := make(map[string]string, len(h.hdr))
	for k, vs := range h.hdr {
		if len(vs) > 0 {
			m[k] = strings.Join(vs, ", ")
		}
	}
	h.err = h.w.Accept(status, m)
}

func (h *httpWriter) Write(p []byte) (int, error) {
	if !h.wrote {
		h.WriteHeader(http.StatusOK)
	}
	if h.err != nil {
		return 0, h.err
	}
	return h.w.Write(p)
}

func (h *httpWriter) Flush() {
	if !h.wrote {
		h.WriteHeader(http.StatusOK)
	}
}
