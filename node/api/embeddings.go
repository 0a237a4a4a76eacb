package api

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node/engine/sim"
	"github.com/kvmesh/kvmesh/node/journey"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/transport"
)

// IngestEmbeddings is POST /v1/embeddings at the ingress.
func (sv *Server) IngestEmbeddings(ctx context.Context, w http.ResponseWriter, r *http.Request, id string, start time.Time) journey.Outcome {
	body, oerr := sv.ReadBody(r)
	var er *openai.EmbeddingsRequest
	if oerr == nil {
		er, oerr = openai.DecodeEmbeddings(bytes.NewReader(body), sv.cfg.MaxBodyBytes)
	}
	if oerr == nil {
		oerr = sv.ClientKVTransfer(er.Extra)
	}
	if oerr != nil {
		sv.m.Decision(admit.LayerValidation, admit.Refuse, oerr.Code)
		return RefuseSimple(w, oerr, 0)
	}
	q := &simpleRequest{ep: transport.EndpointEmbeddings, id: id, body: body,
		adm: admit.Request{Model: er.Model, PromptTokens: embeddingTokens(er.Input)}}
	zero := 0 // embeddings generate nothing: the bucket is charged the input alone
	if o := sv.admitSimple(ctx, w, r, q, start, &zero); o != nil {
		return *o
	}
	local := func(w http.ResponseWriter, origin string) journey.Outcome {
		return sv.serveEmbeddings(ctx, w, er, body, id, origin)
	}
	if sv.cfg.Standalone {
		return local(w, "local")
	}
	cands, _ := sv.simpleCandidates(er.Model, false)
	return sv.dispatchSimple(ctx, w, q, cands, false, local)
}

// embeddingTokens counts an input's tokens as kvindex does a prompt's (a token id is one).
func embeddingTokens(in *openai.EmbeddingInput) int {
	t := 0
	for _, s := range in.Texts {
		t += kvindex.Tokens(len(s))
	}
	for _, ids := range in.Tokens {
		t += len(ids)
	}
	return t
}

// serveEmbeddings runs an embeddings request on this node's engine: an external engine gets
// the body as sent and its answer is relayed; the embedded engine computes them.
func (sv *Server) serveEmbeddings(ctx context.Context, w http.ResponseWriter, er *openai.EmbeddingsRequest, body []byte, id, origin string) journey.Outcome {
	sv.m.Served.WithLabelValues(origin).Inc()
	if sv.ext != nil {
		return sv.passToEngine(ctx, w, "/v1/embeddings", id, body, nil)
	}
	if er.Input.Tokens != nil {
		return RefuseSimple(w, openai.NewError(http.StatusBadRequest, openai.CodeUnsupportedParameter,
			"the embedded engine embeds text only, not token ids").WithParam("input"), 0)
	}
	dims := sim.EmbeddingDims
	if er.Dimensions != nil {
		if *er.Dimensions > sim.EmbeddingDims {
			return RefuseSimple(w, openai.ErrInvalidParameter("dimensions",
				fmt.Sprintf("dimensions must be between 1 and %d", sim.EmbeddingDims)), 0)
		}
		dims = *er.Dimensions
	}
	b64 := er.EncodingFormat != nil && *er.EncodingFormat == openai.EncodingBase64
	resp := openai.Embeddings{Object: "list", Model: er.Model, Data: make([]openai.Embedding, len(er.Input.Texts))}
	for i, text := range er.Input.Texts {
		if ctx.Err() != nil {
			return journey.Outcome{Code: openai.CodeClientClosed}
		}
		e := openai.Embedding{Object: "embedding", Index: i, Vector: sim.Embedding(er.Model, text, dims)}
		if b64 {
			e.Base64 = base64Floats(e.Vector)
		}
		resp.Data[i] = e
		resp.Usage.PromptTokens += kvindex.Tokens(len(text))
	}
	resp.Usage.TotalTokens = resp.Usage.PromptTokens
	w.Header().Set(journey.HeaderNode, sv.cfg.Name)
	WriteJSON(w, http.StatusOK, resp)
	return journey.Outcome{Completed: true}
}

// base64Floats is OpenAI's base64 encoding of a vector: its float32s, little-endian.
func base64Floats(v []float32) string {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return base64.StdEncoding.EncodeToString(b)
}
