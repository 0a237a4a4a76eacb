package journey

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/kvmesh/kvmesh/node/anthropic"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/engine/external"
	"github.com/kvmesh/kvmesh/node/metrics"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/relay"
	"github.com/kvmesh/kvmesh/node/transport"
)

// A Messages request whose owner's engine serves the Messages API natively (an external
// engine's ServesMessages, gossiped as State.MessagesNative) is passed through: it is decoded,
// translated, routed and admitted as any Messages request (node/api), but the engine is sent
// the client's own body at /v1/messages and the client reads the engine's answer byte for
// byte. A forward to such an owner carries the client's body (EndpointMessages); the owner
// answers natively when its engine serves the API, and says so (HeaderNative), else it runs the
// translation to chat and answers in chat, which the ingress translates as usual. A native
// stream does not move once its first byte is sent (no engine continues another's Messages
// stream): a break after it ends the client's stream with an error event.

// HeaderNative, on a response, says an engine that serves the Messages API natively wrote its
// body: "messages". The ingress relays such an answer from an owner as it is.
const HeaderNative = "X-Kvmesh-Native"

const nativeMessages = "messages"

// passer is a writer that translates what is written to it and can step aside for an answer
// already in the client's shape (anthropic.ResponseWriter, and node/api's writer of a
// Messages request, which wraps it).
type passer interface {
	Passthrough() http.ResponseWriter
}

// rawWriter is the writer of a native answer: the client's own (the translating writer
// stepped past, a stream's relay too) at the ingress, the forward's at an owner.
func rawWriter(w http.ResponseWriter) http.ResponseWriter {
	if cs, ok := w.(*relay.Stream); ok {
		w = cs.Client()
	}
	if pw, ok := w.(passer); ok {
		return pw.Passthrough()
	}
	return w
}

// nativeRun sets p.Req.Messages when p is a Messages request this node's engine runs as sent:
// a whole request from its start (no continuation, no half of a split one).
func (x *Executor) nativeRun(p *Request) bool {
	r := &p.Req
	r.Messages = nil
	if p.Native == nil || r.Resume != nil || r.Handover != nil || r.PrefillOnly || !x.host.ServesMessages() {
		return false
	}
	r.Messages = p.Native
	return true
}

// forwardBody is the body of p's forward to owner with header h: the client's Messages body
// (h's endpoint set to EndpointMessages) when owner's engine serves the API natively and the
// forward runs p whole from its start; else the chat body. A delegate is sent the Messages
// body on the same condition (its record is what says it reads EndpointMessages), and passes
// the request through to the owner it picks as this node would.
func (x *Executor) forwardBody(p *Request, owner string, h *transport.Header) []byte {
	if p.Native == nil || h.Prefill || h.Handover != nil || h.Resume != nil || x.g == nil ||
		!x.g.MessagesNative(owner) {
		return p.Req.Body
	}
	h.Endpoint = transport.EndpointMessages
	return p.Native
}

// answerNative writes a native run's answer, from its first chunk on: each chunk's bytes as
// the engine sent them. It returns the usage of an answer that ended.
func (x *Executor) answerNative(ctx context.Context, w http.ResponseWriter, p *Request, st engine.Stream, c engine.Chunk) (Outcome, *engine.Usage) {
	raw := rawWriter(w)
	h := raw.Header()
	h.Set(HeaderNative, nativeMessages)
	if p.Stream {
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
	} else {
		h.Set("Content-Type", "application/json")
	}
	raw.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(raw)
	for {
		if len(c.Raw) > 0 {
			if _, err := raw.Write(c.Raw); err != nil {
				return Outcome{Code: openai.CodeClientClosed}, nil
			}
			_ = rc.Flush()
		}
		if c.FinishReason != "" {
			return Outcome{Completed: true}, c.Usage
		}
		var err error
		if c, err = st.Recv(); err != nil {
			return x.nativeBroke(ctx, raw, p, "this node's engine", err), nil
		}
	}
}

// nativeBroke ends a native stream to raw that broke after its first byte with err (the
// source names what failed): with an error event, unless the engine sent its own, the client
// left, or this node's drain cut it.
func (x *Executor) nativeBroke(ctx context.Context, raw http.ResponseWriter, p *Request, source string, err error) Outcome {
	if e := x.DrainCut(ctx); e != nil {
		_, _ = raw.Write(anthropic.ErrorEvent(e.Message))
		return Outcome{Code: e.Code}
	}
	if ctx.Err() != nil {
		return Outcome{Code: openai.CodeClientClosed}
	}
	if errors.Is(err, external.ErrStream) {
		return Outcome{Code: openai.CodeEngineError} // the engine's own error event was relayed
	}
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	x.log.Warn("native Messages stream broke mid-response; it cannot move", "id", p.Req.ID, "source", source, "err", err)
	_, _ = raw.Write(anthropic.ErrorEvent(fmt.Sprintf("%s failed mid-stream: %v", source, err)))
	_ = http.NewResponseController(raw).Flush()
	return Outcome{Code: openai.CodeEngineError}
}

// relayNative relays an owner's native answer (HeaderNative) to the client as it is, and
// reports false for any other answer, which Relay handles. A whole answer whose owner failed
// before its end runs again (nothing was sent); a stream that breaks after its first event
// ends with an error event, counted as a migration refused.
func (x *Executor) relayNative(ctx context.Context, w http.ResponseWriter, resp *transport.Response, p *Request, owner string, start time.Time) (Outcome, bool) {
	if resp.Status != http.StatusOK || resp.Headers[HeaderNative] != nativeMessages {
		return Outcome{}, false
	}
	var body []byte
	if !p.Stream {
		var err error
		if body, err = io.ReadAll(resp.Body); err != nil {
			return x.Migrate(ctx, w, p, owner, err), true
		}
	}
	raw := rawWriter(w)
	for k, v := range resp.Headers {
		if !IngressHeader(k) {
			raw.Header().Set(k, v)
		}
	}
	raw.WriteHeader(http.StatusOK)
	if p.Origin == nil {
		x.m.TTFT.Observe(time.Since(start).Seconds())
	}
	if !p.Stream {
		if _, err := raw.Write(body); err != nil {
			return Outcome{Code: openai.CodeClientClosed}, true
		}
		return Outcome{Completed: true}, true
	}
	return x.relayNativeStream(ctx, raw, resp.Body, p, owner), true
}

// relayNativeStream passes an owner's native stream on to raw event by event, each whole.
func (x *Executor) relayNativeStream(ctx context.Context, raw http.ResponseWriter, body io.Reader, p *Request, owner string) Outcome {
	rc := http.NewResponseController(raw)
	er := anthropic.NewEventReader(body)
	var t anthropic.Tally
	for {
		ev, err := er.Next()
		switch {
		case err == io.EOF && t.Stopped:
			return Outcome{Completed: true}
		case err == io.EOF && t.Failed:
			return Outcome{Code: openai.CodeEngineError} // the engine's error event was relayed
		case err != nil:
			if ctx.Err() == nil && x.DrainCut(ctx) == nil {
				x.m.Migrated.WithLabelValues(metrics.MigrationRefused, causeOf(err)).Inc()
			}
			return x.nativeBroke(ctx, raw, p, "node "+owner, err)
		}
		t.Add(ev)
		if _, err := raw.Write(ev.Raw); err != nil {
			return Outcome{Code: openai.CodeClientClosed}
		}
		_ = rc.Flush()
	}
}
