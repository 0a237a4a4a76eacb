package node

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
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/relay"
	"github.com/kvmesh/kvmesh/node/transport"
)

// A Messages request whose owner's engine serves the Messages API natively (an external
// engine's ServesMessages, gossiped as State.MessagesNative) is passed through: it is decoded,
// translated, routed and admitted as any Messages request (messages.go), but the engine is
// sent the client's own body at /v1/messages and the client reads the engine's answer byte
// for byte. A forward to such an owner carries the client's body (EndpointMessages); the owner
// answers natively when its engine serves the API, and says so (HeaderNative), else it runs the
// translation to chat and answers in chat, which the ingress translates as usual. A native
// stream does not move once its first byte is sent (no engine continues another's Messages
// stream): a break after it ends the client's stream with an error event.

// HeaderNative, on a response, says an engine that serves the Messages API natively wrote its
// body: "messages". The ingress relays such an answer from an owner as it is.
const HeaderNative = "X-Kvmesh-Native"

const nativeMessages = "messages"

// messagesWriter is the writer of a Messages request at its ingress: the translating writer,
// and the client's body, for an engine that serves the API natively (nativeOf).
type messagesWriter struct {
	*anthropic.ResponseWriter
	body []byte
}

// nativeOf is the client's Messages body when w is a Messages request's writer, else nil.
func nativeOf(w http.ResponseWriter) []byte {
	if mw, ok := w.(*messagesWriter); ok {
		return mw.body
	}
	return nil
}

// rawWriter is the writer of a native answer: the client's own (the translating writer
// stepped past, a stream's relay too) at the ingress, the forward's at an owner.
func rawWriter(w http.ResponseWriter) http.ResponseWriter {
	if cs, ok := w.(*relay.Stream); ok {
		w = cs.Client()
	}
	switch aw := w.(type) {
	case *messagesWriter:
		return aw.Passthrough()
	case *anthropic.ResponseWriter:
		return aw.Passthrough()
	}
	return w
}

// servesMessages reports whether this node's engine serves the Messages API natively.
func (n *Node) servesMessages() bool { return n.ext != nil && n.ext.ServesMessages() }

// nativeRun sets p.req.Messages when p is a Messages request this node's engine runs as sent:
// a whole request from its start (no continuation, no half of a split one).
func (n *Node) nativeRun(p *prepared) bool {
	r := &p.req
	r.Messages = nil
	if p.native == nil || r.Resume != nil || r.Handover != nil || r.PrefillOnly || !n.servesMessages() {
		return false
	}
	r.Messages = p.native
	return true
}

// prepareForward prepares a forwarded request's body: for EndpointMessages, the client's
// Messages body, translated to chat as the ingress did, and kept for a native run.
func (n *Node) prepareForward(ep engine.Endpoint, h transport.Header, body []byte) (*prepared, *openai.Error) {
	if h.Endpoint != transport.EndpointMessages {
		return n.prepare(ep, h.RequestID, body)
	}
	req, oerr := anthropic.Decode(body, false)
	if oerr != nil {
		return nil, oerr
	}
	p, oerr := n.prepare(engine.Chat, h.RequestID, anthropic.ToChat(req))
	if oerr == nil {
		p.native = body
	}
	return p, oerr
}

// forwardBody is the body of p's forward to owner with header h: the client's Messages body
// (h's endpoint set to EndpointMessages) when owner's engine serves the API natively and the
// forward runs p whole from its start; else the chat body. A delegate is sent the Messages
// body on the same condition (its record is what says it reads EndpointMessages), and passes
// the request through to the owner it picks as this node would.
func (n *Node) forwardBody(p *prepared, owner string, h *transport.Header) []byte {
	if p.native == nil || h.Prefill || h.Handover != nil || h.Resume != nil || n.g == nil ||
		!n.g.MessagesNative(owner) {
		return p.req.Body
	}
	h.Endpoint = transport.EndpointMessages
	return p.native
}

// answerNative writes a native run's answer, from its first chunk on: each chunk's bytes as
// the engine sent them. It returns the usage of an answer that ended.
func (n *Node) answerNative(ctx context.Context, w http.ResponseWriter, p *prepared, st engine.Stream, c engine.Chunk) (outcome, *engine.Usage) {
	raw := rawWriter(w)
	h := raw.Header()
	h.Set(HeaderNative, nativeMessages)
	if p.stream {
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
				return outcome{code: openai.CodeClientClosed}, nil
			}
			_ = rc.Flush()
		}
		if c.FinishReason != "" {
			return outcome{completed: true}, c.Usage
		}
		var err error
		if c, err = st.Recv(); err != nil {
			return n.nativeBroke(ctx, raw, p, "this node's engine", err), nil
		}
	}
}

// nativeBroke ends a native stream to raw that broke after its first byte with err (the
// source names what failed): with an error event, unless the engine sent its own, the client
// left, or this node's drain cut it.
func (n *Node) nativeBroke(ctx context.Context, raw http.ResponseWriter, p *prepared, source string, err error) outcome {
	if e := n.drainCut(ctx); e != nil {
		_, _ = raw.Write(anthropic.ErrorEvent(e.Message))
		return outcome{code: e.Code}
	}
	if ctx.Err() != nil {
		return outcome{code: openai.CodeClientClosed}
	}
	if errors.Is(err, external.ErrStream) {
		return outcome{code: openai.CodeEngineError} // the engine's own error event was relayed
	}
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	n.log.Warn("native Messages stream broke mid-response; it cannot move", "id", p.req.ID, "source", source, "err", err)
	_, _ = raw.Write(anthropic.ErrorEvent(fmt.Sprintf("%s failed mid-stream: %v", source, err)))
	_ = http.NewResponseController(raw).Flush()
	return outcome{code: openai.CodeEngineError}
}

// relayNative relays an owner's native answer (HeaderNative) to the client as it is, and
// reports false for any other answer, which relay handles. A whole answer whose owner failed
// before its end runs again (nothing was sent); a stream that breaks after its first event
// ends with an error event, counted as a migration refused.
func (n *Node) relayNative(ctx context.Context, w http.ResponseWriter, resp *transport.Response, p *prepared, owner string, start time.Time) (outcome, bool) {
	if resp.Status != http.StatusOK || resp.Headers[HeaderNative] != nativeMessages {
		return outcome{}, false
	}
	var body []byte
	if !p.stream {
		var err error
		if body, err = io.ReadAll(resp.Body); err != nil {
			return n.migrate(ctx, w, p, owner, err), true
		}
	}
	raw := rawWriter(w)
	for k, v := range resp.Headers {
		if !ingressHeader(k) {
			raw.Header().Set(k, v)
		}
	}
	raw.WriteHeader(http.StatusOK)
	if p.origin == nil {
		n.m.ttft.Observe(time.Since(start).Seconds())
	}
	if !p.stream {
		if _, err := raw.Write(body); err != nil {
			return outcome{code: openai.CodeClientClosed}, true
		}
		return outcome{completed: true}, true
	}
	return n.relayNativeStream(ctx, raw, resp.Body, p, owner), true
}

// relayNativeStream passes an owner's native stream on to raw event by event, each whole.
func (n *Node) relayNativeStream(ctx context.Context, raw http.ResponseWriter, body io.Reader, p *prepared, owner string) outcome {
	rc := http.NewResponseController(raw)
	er := anthropic.NewEventReader(body)
	var t anthropic.Tally
	for {
		ev, err := er.Next()
		switch {
		case err == io.EOF && t.Stopped:
			return outcome{completed: true}
		case err == io.EOF && t.Failed:
			return outcome{code: openai.CodeEngineError} // the engine's error event was relayed
		case err != nil:
			if ctx.Err() == nil && n.drainCut(ctx) == nil {
				n.m.migrated.WithLabelValues(migrationRefused, causeOf(err)).Inc()
			}
			return n.nativeBroke(ctx, raw, p, "node "+owner, err)
		}
		t.Add(ev)
		if _, err := raw.Write(ev.Raw); err != nil {
			return outcome{code: openai.CodeClientClosed}
		}
		_ = rc.Flush()
	}
}
