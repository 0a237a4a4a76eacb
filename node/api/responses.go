package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node/journey"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/responseid"
	"github.com/kvmesh/kvmesh/node/transport"
)

// Response ids are node/responseid's: a continuation goes to the node whose tag its
// previous_response_id carries.

// responseOwner finds the node whose responses carry tag: this one, or a live peer (a
// suspect one too: it may be back).
func (sv *Server) responseOwner(tag string) (simpleCandidate, bool) {
	if responseid.Tag(sv.cfg.Name) == tag {
		return simpleCandidate{name: sv.cfg.Name, self: true}, true
	}
	if sv.g == nil {
		return simpleCandidate{}, false
	}
	for _, m := range sv.g.Members() {
		if m.Self || (m.Liveness != gossip.LivenessAlive && m.Liveness != gossip.LivenessSuspect) {
			continue
		}
		if responseid.Tag(m.Name) == tag {
			return simpleCandidate{name: m.Name, quic: m.State.QUICAddr}, true
		}
	}
	return simpleCandidate{}, false
}

func errPreviousNotFound(msg string) *openai.Error {
	return openai.NewError(http.StatusNotFound, CodePreviousResponseNotFound, msg).WithParam("previous_response_id")
}

// IngestResponses is POST /v1/responses at the ingress: a continuation goes to the node that
// ran the response it continues, a new response to the least loaded node in front of an
// external engine that serves the model.
func (sv *Server) IngestResponses(ctx context.Context, w http.ResponseWriter, r *http.Request, id string, start time.Time) journey.Outcome {
	body, oerr := sv.ReadBody(r)
	var rr *openai.ResponsesRequest
	if oerr == nil {
		rr, oerr = openai.DecodeResponses(bytes.NewReader(body), sv.cfg.MaxBodyBytes)
	}
	if oerr == nil {
		oerr = sv.ClientKVTransfer(rr.Extra)
	}
	if oerr != nil {
		sv.m.Decision(admit.LayerValidation, admit.Refuse, oerr.Code)
		return RefuseSimple(w, oerr, 0)
	}
	// The input's shape is the engine's to read; its size is what the key is charged for.
	q := &simpleRequest{ep: transport.EndpointResponses, id: id, body: body,
		adm: admit.Request{Model: rr.Model, PromptTokens: kvindex.Tokens(len(body))}}
	if o := sv.admitSimple(ctx, w, r, q, start, rr.MaxOutputTokens); o != nil {
		return *o
	}
	local := func(w http.ResponseWriter, origin string) journey.Outcome {
		return sv.serveResponses(ctx, w, rr, q.body, id, origin) // q.body: its output cap as admitted
	}
	if rr.PreviousResponseID != nil {
		prev := *rr.PreviousResponseID
		tag, _, ok := responseid.Parse(prev)
		if !ok {
			return RefuseSimple(w, errPreviousNotFound(fmt.Sprintf("response %q was not produced by this mesh", clipID(prev))), 0)
		}
		owner, ok := sv.responseOwner(tag)
		if !ok {
			return RefuseSimple(w, errPreviousNotFound(fmt.Sprintf(
				"the node that produced response %q has left the mesh, and its engine's state went with it", clipID(prev))), 0)
		}
		return sv.dispatchSimple(ctx, w, q, []simpleCandidate{owner}, true, local)
	}
	if sv.cfg.Standalone {
		return local(w, "local")
	}
	cands, embedded := sv.simpleCandidates(rr.Model, true)
	if len(cands) == 0 && embedded {
		return RefuseSimple(w, openai.NewError(http.StatusBadRequest, CodeUnsupportedEndpoint, fmt.Sprintf(
			"the nodes that serve %q run the embedded engine, which does not implement the Responses API", rr.Model)), 0)
	}
	return sv.dispatchSimple(ctx, w, q, cands, false, local)
}

func clipID(s string) string {
	if len(s) > 128 {
		return s[:128] + "..."
	}
	return s
}

// serveResponses runs a Responses API request on this node's engine: only an external one
// implements it. previous_response_id is restored to the engine's own id, and the id of the
// response the engine makes is tagged with this node's on the way back.
func (sv *Server) serveResponses(ctx context.Context, w http.ResponseWriter, rr *openai.ResponsesRequest, body []byte, id, origin string) journey.Outcome {
	sv.m.Served.WithLabelValues(origin).Inc()
	if sv.ext == nil {
		return RefuseSimple(w, openai.NewError(http.StatusBadRequest, CodeUnsupportedEndpoint,
			"the embedded engine does not implement the Responses API"), 0)
	}
	tag := responseid.Tag(sv.cfg.Name)
	if rr.PreviousResponseID != nil {
		ptag, engineID, ok := responseid.Parse(*rr.PreviousResponseID)
		if !ok || ptag != tag {
			return RefuseSimple(w, errPreviousNotFound(fmt.Sprintf("response %q was not produced by node %s",
				clipID(*rr.PreviousResponseID), sv.cfg.Name)), 0)
		}
		v, _ := json.Marshal(engineID)
		var err error
		if body, err = openai.SetMember(body, "previous_response_id", func([]byte) []byte { return v }); err != nil {
			return RefuseSimple(w, openai.ErrInvalidRequest(err.Error()), 0)
		}
	}
	return sv.passToEngine(ctx, w, "/v1/responses", id, body, func(r io.Reader, ct string) io.Reader { return responseid.Rewrite(r, ct, tag) })
}
