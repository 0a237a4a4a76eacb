package external

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"

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
