package external

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"

	"go.opentelemetry.io/otel/trace"

	"github.com/kvmesh/kvmesh/node/engine"
)

// Post sends body, a JSON object, to the engine's path (a JSON API the node relays without
// reading the answer: /v1/embeddings, /v1/responses) as it is but for a client's priority,
// removed (dropPriority: these requests are sent none, with or without Config.Priority), and
// returns the engine's answer whatever its status; the caller must close its body. An error
// means the engine gave no answer: it wraps engine.ErrUnavailable, or is ctx's (or
// engine.ErrRejected for a body that is no object). While the answer is open it counts as in
// flight (the load of an engine of KindOpenAI).
func (e *Engine) Post(ctx context.Context, path, id string, body []byte) (*http.Response, error) {
	body, err := dropPriority(body)
	if err != nil {
		return nil, err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url(path), bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("external: building request: %w", err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	if id != "" {
		hreq.Header.Set("X-Request-Id", id)
	}
	span := startCall(hreq)
	resp, err := e.client.Do(hreq)
	if err != nil {
		callFailed(span, err)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("external: request cancelled: %w", ctx.Err())
		}
		return nil, fmt.Errorf("external: %w: %w", engine.ErrUnavailable, err)
	}
	callAnswered(span, resp.StatusCode)
	e.inflight.Add(1)
	var once sync.Once
	resp.Body = &closeHook{ReadCloser: resp.Body, done: func() { once.Do(func() { e.inflight.Add(-1); span.End() }) }}
	return resp, nil
}

type closeHook struct {
	io.ReadCloser
	done func()
}

func (c *closeHook) Close() error {
	err := c.ReadCloser.Close()
	c.done()
	return err
}

// ErrorOf reads an engine's error answer of status from body, as Generate does: the result's
// APIError says what the client gets.
func ErrorOf(status int, body []byte) *StatusError {
	return statusError(&http.Response{StatusCode: status, Body: io.NopCloser(bytes.NewReader(body))})
}

// engineCall is a generation the engine answered 200: its response, the context that cancels
// it, and its client span.
type engineCall struct {
	resp   *http.Response
	ctx    context.Context
	cancel context.CancelFunc
	span   trace.Span
}

// end closes the call: its body, its context and its span.
func (c *engineCall) end() {
	c.resp.Body.Close()
	c.cancel()
	c.span.End()
}

// call posts body for req to the engine's path (accepting a stream when stream) and returns
// the call once the engine answered 200; any other answer is a *StatusError, no answer an
// error wrapping engine.ErrUnavailable (or ctx's).
func (e *Engine) call(ctx context.Context, path string, body []byte, req *engine.Request, stream bool) (*engineCall, error) {
	sctx, cancel := context.WithCancel(ctx)
	hreq, err := http.NewRequestWithContext(sctx, http.MethodPost, e.url(path), bytes.NewReader(body))
	if err != nil {
		cancel()
		return nil, fmt.Errorf("external: building request: %w", err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	if stream {
		hreq.Header.Set("Accept", "text/event-stream")
	}
	if req.ID != "" {
		hreq.Header.Set("X-Request-Id", req.ID)
	}
	if req.Priority != 0 {
		// A kvmesh engine (the embedded engine served alone) schedules by it; other engines
		// ignore the header (vLLM's own field is SetPriority's, with Config.Priority).
		hreq.Header.Set(PriorityHeader, strconv.Itoa(req.Priority))
	}
	span := startCall(hreq)
	resp, err := e.client.Do(hreq)
	if err != nil {
		cancel()
		callFailed(span, err)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("external: request cancelled: %w", ctx.Err())
		}
		return nil, fmt.Errorf("external: %w: %w", engine.ErrUnavailable, err)
	}
	callAnswered(span, resp.StatusCode)
	if resp.StatusCode != http.StatusOK {
		se := statusError(resp)
		resp.Body.Close()
		cancel()
		span.End()
		e.log.Debug("engine refused request", "id", req.ID, "status", se.Status, "message", se.Message)
		if req.Handover != nil && se.Param == "kv_transfer_params" {
			// The handover is the prefill's, not the client's: another decode node may take it.
			return nil, fmt.Errorf("external: %w: the engine refused the handover: %s", engine.ErrUnavailable, se.Message)
		}
		return nil, se
	}
	return &engineCall{resp: resp, ctx: sctx, cancel: cancel, span: span}, nil
}
