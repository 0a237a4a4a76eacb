package external

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/kvmesh/kvmesh/node/engine"
	wire "github.com/kvmesh/kvmesh/node/openai"
)

// generate forwards req to the engine and returns once the engine answered 200 and its stream
// is open (Generate, in residency.go, wraps it). A prefill half (req.PrefillOnly) is sent in a
// vLLM prefill server's shape and answered at once with its handover (disagg.go); a Messages
// request goes to /v1/messages (messages.go).
func (e *Engine) generate(ctx context.Context, req *engine.Request) (engine.Stream, error) {
	if req.Messages != nil {
		return e.generateMessages(ctx, req)
	}
	path := "/v1/chat/completions"
	if req.Endpoint == engine.Completion {
		path = "/v1/completions"
	}
	body, err := e.body(req)
	if err != nil {
		return nil, err
	}
	c, err := e.call(ctx, path, body, req, !req.PrefillOnly)
	if err != nil {
		return nil, err
	}
	if req.PrefillOnly {
		st, err := readPrefill(c.resp.Body, req)
		c.end()
		return st, err
	}
	e.inflight.Add(1)
	s := &stream{ctx: c.ctx, cancel: c.cancel, body: c.resp.Body, sse: wire.NewSSEReader(c.resp.Body),
		onClose: func() { e.inflight.Add(-1); c.span.End() }}
	return s, nil
}

// body is the request body to send the engine for req: the client's, streamed (or, for a
// prefill half, in a prefill server's shape), with the node's priority (or none), the
// admitted max_tokens, a continuation's text or a handover's transfer parameters.
func (e *Engine) body(req *engine.Request) ([]byte, error) {
	if (req.PrefillOnly || req.Handover != nil) && e.cfg.Kind != KindVLLM {
		return nil, fmt.Errorf("external: %w: a %s engine is given no half of a split request (only %s)",
			engine.ErrUnavailable, e.cfg.Kind, KindVLLM)
	}
	// The streaming, the priority and the output cap, in one pass over the client's body.
	edits := []wire.Edit{priority(e.cfg.Priority, req.Priority)}
	if m, ok := e.sglangModel(req.Model); ok {
		q, _ := json.Marshal(m)
		edits = append(edits, wire.Edit{Name: "model", Value: constant(string(q)), Add: true})
	}
	if req.MaxTokens > 0 {
		// Images and audio are in the prompt the node counted at an estimate only (other
		// parts not at all), so a default it fills in, cut to the context it thinks is left,
		// could pass the context; without a cap of the client's, such a request keeps the
		// engine's default, the rest of its context.
		parts := slices.ContainsFunc(req.Extra, func(f wire.Field) bool { return strings.HasPrefix(f.Name, "messages[") })
		edits = append(edits, outputCap(req.MaxTokens, !parts)...)
	}
	body := bytes.TrimSpace(req.Body)
	var err error
	if len(body) == 0 {
		body, err = synthesise(req)
	} else {
		edits = append(streaming(), edits...)
	}
	if err == nil {
		body, err = edit(body, edits...)
	}
	if err == nil && req.Resume != nil {
		body, err = continueBody(e.cfg.Kind, req.Endpoint, body, req.Resume)
	}
	switch {
	case err != nil:
		return nil, err
	case req.PrefillOnly:
		return prefillBody(body)
	case req.Handover != nil:
		return decodeBody(body, req.Handover)
	}
	return body, nil
}
