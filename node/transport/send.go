package transport

import (
	"bufio"
	"context"
	"errors"
	"fmt"

	"github.com/quic-go/quic-go"
)

// forward sends one header and body to addr and reads the owner's answer.
//
// A forward whose connection proves dead before the owner answers (deadConn) is sent once
// more on a new connection, and its failure is the second send's: a pooled connection can be
// dead without this side knowing it, when the peer restarted or forgot it (its stateless reset
// arrives only in answer to the forward's first packet) or when this host was frozen or
// suspended past the idle timeout (the timer fires only once the process runs again, while
// the forwards queued on it race to use the connection). The owner cannot be running the
// first send by then, since the connection that carried it is gone on its side too. A peer
// that is really gone fails the redial within Config.HandshakeTimeout.
func (t *Transport) forward(ctx context.Context, addr string, h Header, body []byte) (*Response, string, error) {
	if len(body) > t.cfg.MaxBodyBytes {
		return nil, resultError, fmt.Errorf("%w: %d bytes (> %d)", ErrTooLarge, len(body), t.cfg.MaxBodyBytes)
	}
	hdr, err := EncodeHeader(nil, h)
	if err != nil {
		return nil, resultError, err
	}
	msg := appendFrameHead(make([]byte, 0, len(hdr)+2*maxFrameHead+min(len(body), 64<<10)), frameHeader, len(hdr))
	msg = append(msg, hdr...)
	msg = appendFrameHead(msg, frameBody, len(body))
	// Small bodies go out with the header in one write; a large one is not copied.
	if len(body) <= 64<<10 {
		msg = append(msg, body...)
		body = nil
	}
	for redialled := false; ; redialled = true {
		c, err := t.conn(ctx, addr)
		if err != nil {
			return nil, failResult(ctx), connError(ctx, addr, err)
		}
		resp, result, err := t.exchange(ctx, addr, c, msg, body)
		if result != resultUnreachable || redialled || !deadConn(c, err) {
			return resp, result, err
		}
		t.forget(addr, c)
		t.m.redials.Inc()
		t.log.Debug("transport: connection to the owner was dead; redialling once", "request_id", h.RequestID, "addr", addr, "err", err)
	}
}

// connError is the forward's error for err, conn's failure to provide a connection to addr.
func connError(ctx context.Context, addr string, err error) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("transport: forward to %s: %w", addr, ctx.Err())
	case errors.Is(err, ErrClosed), errors.Is(err, ErrNotStarted), errors.Is(err, ErrUnreachable):
		return err
	}
	return fmt.Errorf("%w: %s: %w", ErrUnreachable, addr, err)
}

// deadConn reports whether err, a forward's failure on c before any answer, came from c's end
// rather than from the owner's handling of the stream: c has closed, or err is a connection's
// close (connClosed). quic-go fails the streams before it ends the connection's context, hence
// both tests.
func deadConn(c *quic.Conn, err error) bool {
	return c.Context().Err() != nil || connClosed(err)
}

// connClosed reports whether err is a connection's end that the peer or the path caused: silent
// past the idle timeout, reset by a peer that no longer knows it, or closed by the peer.
func connClosed(err error) bool {
	var (
		idle  *quic.IdleTimeoutError
		reset *quic.StatelessResetError
		app   *quic.ApplicationError
	)
	return errors.As(err, &idle) || errors.As(err, &reset) || errors.As(err, &app) && app.Remote
}

// exchange opens a stream on c, sends msg and body and reads the owner's first frame: an
// accepted Response, a *Refusal, or a failure (resultUnreachable, or resultCancelled when ctx
// ended).
func (t *Transport) exchange(ctx context.Context, addr string, c *quic.Conn, msg, body []byte) (*Response, string, error) {
	str, err := c.OpenStreamSync(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, resultCancelled, fmt.Errorf("transport: forward to %s: %w", addr, ctx.Err())
		}
		return nil, resultUnreachable, fmt.Errorf("%w: %s: open stream: %w", ErrUnreachable, addr, err)
	}
	stop := context.AfterFunc(ctx, func() {
		str.CancelRead(codeCancel)
		str.CancelWrite(codeCancel)
	})
	abort := func(err error) (*Response, string, error) {
		stop()
		str.CancelRead(codeCancel)
		str.CancelWrite(codeCancel)
		if ctx.Err() != nil {
			return nil, resultCancelled, fmt.Errorf("transport: forward to %s: %w", addr, ctx.Err())
		}
		if se := (*quic.StreamError)(nil); errors.As(err, &se) && se.Remote && se.ErrorCode == codeProtocol {
			err = fmt.Errorf("%w: %w", ErrRejected, err)
		}
		return nil, resultUnreachable, fmt.Errorf("%w: %s: %w", ErrUnreachable, addr, err)
	}
	if _, err := str.Write(msg); err != nil {
		return abort(peerReason(str, err))
	}
	if len(body) > 0 {
		if _, err := str.Write(body); err != nil {
			return abort(peerReason(str, err))
		}
	}
	if err := str.Close(); err != nil {
		return abort(peerReason(str, err))
	}
	br := bufio.NewReaderSize(str, 32<<10)
	typ, p, err := readFrame(br, MaxAnswerBytes)
	if err != nil {
		return abort(err)
	}
	switch typ {
	case frameRefuse:
		r, err := decodeRefuse(p)
		if err != nil {
			return abort(err)
		}
		stop()
		str.CancelRead(codeCancel)
		return nil, resultRefused, r
	case frameAccept:
		status, headers, err := decodeAccept(p)
		if err != nil {
			return abort(err)
		}
		b := &respBody{str: str, br: br, stop: stop, ctxErr: ctx.Err}
		return &Response{Status: status, Headers: headers, Body: b}, resultAccepted, nil
	default:
		return abort(fmt.Errorf("%w: frame type %d before the answer", ErrMalformed, typ))
	}
}

func failResult(ctx context.Context) string {
	if ctx.Err() != nil {
		return resultCancelled
	}
	return resultUnreachable
}
