package api

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/node/anthropic"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/journey"
	"github.com/kvmesh/kvmesh/node/openai"
)

// The Messages API (POST /v1/messages) is translated at the ingress: its body becomes the
// equivalent chat completions body (anthropic.ToChat), which takes the chat path from
// decoding on (validation, identity, budget, routing on the chat messages' prefix, admission,
// the waiting room, forwarding, migration), and the chat answer the path writes becomes the
// Messages answer on its way to the client (anthropic.ResponseWriter). A forwarded Messages
// request is a chat request to its owner, unless the owner's engine serves the Messages API
// natively (native.go).

// The anthropic-version and anthropic-beta headers are accepted with any value and change
// nothing (the key may come in HeaderAPIKey).

// Endpoint labels of the Messages API in the request counters.
const (
	EndpointMessages    = "messages"
	EndpointCountTokens = "count_tokens"
)

// IngestMessages is POST /v1/messages at the ingress.
func (sv *Server) IngestMessages(ctx context.Context, w http.ResponseWriter, r *http.Request, id string, start time.Time) journey.Outcome {
	aw := anthropic.NewResponseWriter(w)
	defer sv.finishMessages(aw, r)
	req, body, o := sv.decodeMessages(aw, r, false)
	if req == nil {
		return o
	}
	aw.SetStopSequences(req.StopSequences)
	return sv.IngestBody(ctx, &messagesWriter{ResponseWriter: aw, body: req.Raw}, r, engine.Chat, id, start, body)
}

// finishMessages sends aw's answer. A request the drain ended before anything was written is
// answered 503 draining here, in the Messages shape, rather than by the server's handler in
// OpenAI's.
func (sv *Server) finishMessages(aw *anthropic.ResponseWriter, r *http.Request) {
	if e := sv.x.DrainCut(r.Context()); e != nil && !aw.Wrote() {
		journey.WriteRefusal(aw, e, 0)
	}
	aw.Finish()
}

// decodeMessages authenticates r, reads its body and translates it into a chat body. On a
// refusal (written to w) the request is nil and the outcome says why.
func (sv *Server) decodeMessages(w http.ResponseWriter, r *http.Request, count bool) (*anthropic.Request, []byte, journey.Outcome) {
	if o, ok := sv.Authenticate(w, r); !ok {
		return nil, nil, o
	}
	body, oerr := sv.ReadBody(r)
	var req *anthropic.Request
	if oerr == nil {
		req, oerr = anthropic.Decode(body, count)
	}
	if oerr == nil {
		oerr = sv.checkStopSequences(req)
	}
	if oerr != nil {
		sv.m.Decision(admit.LayerValidation, admit.Refuse, oerr.Code)
		return nil, nil, RefuseSimple(w, oerr, 0)
	}
	return req, anthropic.ToChat(req), journey.Outcome{}
}

// checkStopSequences holds stop_sequences to the bound chat's stop has
// (validation.max_stop), naming the Messages field: they become the chat request's stop.
func (sv *Server) checkStopSequences(req *anthropic.Request) *openai.Error {
	if limit := sv.adm.Config().Validation.MaxStop; len(req.StopSequences) > limit {
		return openai.NewError(http.StatusBadRequest, openai.CodeInvalidParameter,
			fmt.Sprintf("stop_sequences: at most %d stop sequences are allowed (validation.max_stop)", limit)).WithParam("stop_sequences")
	}
	return nil
}

// WriteRouteError answers a path or a method the API does not serve: in the Messages API's
// error shape under /v1/messages, in OpenAI's elsewhere.
func WriteRouteError(w http.ResponseWriter, r *http.Request, e *openai.Error) {
	if p := r.URL.Path; p != "/v1/messages" && !strings.HasPrefix(p, "/v1/messages/") {
		openai.WriteError(w, e)
		return
	}
	aw := anthropic.NewResponseWriter(w)
	openai.WriteError(aw, e)
	aw.Finish()
}

// countTokens is the body of a count_tokens answer.
type countTokens struct {
	InputTokens int `json:"input_tokens"`
}

// IngestCountTokens is POST /v1/messages/count_tokens: the prompt tokens admission would
// count for the request (the rendered system prompt and messages, in the model's tokens as
// far as the mesh has learned them; tool definitions are not part of the prompt kvmesh
// renders). It needs a key, as generation does, and charges it nothing.
func (sv *Server) IngestCountTokens(ctx context.Context, w http.ResponseWriter, r *http.Request, id string, start time.Time) journey.Outcome {
	aw := anthropic.NewResponseWriter(w)
	defer sv.finishMessages(aw, r)
	req, body, o := sv.decodeMessages(aw, r, true)
	if req == nil {
		return o
	}
	p, oerr := sv.Prepare(engine.Chat, id, body)
	if oerr == nil {
		if _, ok := sv.host.MeshModelInfo(req.Model); !ok {
			oerr = openai.ErrModelNotFound(req.Model)
		}
	}
	if oerr != nil {
		sv.m.Decision(admit.LayerValidation, admit.Refuse, oerr.Code)
		return RefuseSimple(aw, oerr, 0)
	}
	WriteJSON(w, http.StatusOK, countTokens{InputTokens: p.Adm.PromptTokens})
	return journey.Outcome{Completed: true}
}
