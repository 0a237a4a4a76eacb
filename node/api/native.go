package api

import (
	"net/http"

	"github.com/kvmesh/kvmesh/node/anthropic"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/journey"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/transport"
)

// A Messages request keeps the client's body beside its translation to chat
// (journey.Request.Native), for an owner whose engine serves the Messages API natively; the
// journey passes it through (node/journey's native.go).

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

// PrepareForward prepares a forwarded request's body, h's: for EndpointMessages, the client's
// Messages body, translated to chat as the ingress did, and kept for a native run.
func (sv *Server) PrepareForward(ep engine.Endpoint, h transport.Header, body []byte) (*journey.Request, *openai.Error) {
	if h.Endpoint != transport.EndpointMessages {
		return sv.Prepare(ep, h.RequestID, body)
	}
	req, oerr := anthropic.Decode(body, false)
	if oerr != nil {
		return nil, oerr
	}
	p, oerr := sv.Prepare(engine.Chat, h.RequestID, anthropic.ToChat(req))
	if oerr == nil {
		p.Native = body
	}
	return p, oerr
}
