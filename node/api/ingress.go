package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/plan"
	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node/attempt"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/engine/external"
	"github.com/kvmesh/kvmesh/node/journey"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/transport"
)

func EndpointName(ep engine.Endpoint) string {
	if ep == engine.Completion {
		return "completions"
	}
	return "chat"
}

func NewRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ReadBody reads r's body: at most MaxBodyBytes (413 above) within BodyTimeout (408 past it),
// and not encoded (415): the node reads the JSON itself, so a compressed body would otherwise
// be refused as malformed, and an encoding named over a plain body be forwarded as a lie.
func (sv *Server) ReadBody(r *http.Request) ([]byte, *openai.Error) {
	for _, v := range r.Header.Values("Content-Encoding") {
		for ce := range strings.SplitSeq(v, ",") {
			if ce = strings.TrimSpace(ce); ce != "" && !strings.EqualFold(ce, "identity") {
				return nil, openai.NewError(http.StatusUnsupportedMediaType, openai.CodeUnsupportedMediaType,
					fmt.Sprintf("Content-Encoding %q is not supported: send the body uncompressed", ce)).WithParam("Content-Encoding")
			}
		}
	}
	limit := sv.cfg.MaxBodyBytes
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil, openai.NewError(http.StatusRequestTimeout, openai.CodeBodyTimeout,
			fmt.Sprintf("the request body did not arrive within %v", sv.cfg.BodyTimeout))
	case err != nil:
		return nil, openai.NewError(http.StatusBadRequest, openai.CodeInvalidRequest, "reading request body: "+err.Error())
	case int64(len(body)) > limit:
		return nil, openai.NewError(http.StatusRequestEntityTooLarge, openai.CodeBodyTooLarge,
			fmt.Sprintf("request body is larger than %d bytes", limit))
	}
	return body, nil
}

// Prepare decodes body, renders the prompt and hashes its blocks. Bounds, the model and the
// context budget are admission's to check.
func (sv *Server) Prepare(ep engine.Endpoint, id string, body []byte) (*journey.Request, *openai.Error) {
	p := &journey.Request{Endpoint: ep}
	var (
		seed   *int64
		prompt []byte
		oerr   *openai.Error
		a      = &p.Adm
		r      = &p.Req // what the engine needs beyond the prompt; the literal below keeps it
	)
	if ep == engine.Chat {
		prompt, seed, oerr = sv.decodeChat(p, body)
	} else {
		prompt, seed, oerr = sv.decodeCompletion(p, body)
	}
	if oerr != nil {
		return nil, oerr
	}
	mm, _ := sv.host.MeshModel(a.Model)
	p.Model = engine.Model{Name: a.Model, ContextTokens: mm.ContextTokens}
	a.Parent = mm.Parent // an adapter's request runs on its base model's nodes (route.Request.Parent)
	// Admission counts the prompt's text in the model's own tokens, as far as this node or
	// the mesh has learned them (promptTokens), and its images and audio at their estimates;
	// the engine's request keeps kvindex's count, the blocks' unit.
	textBytes := len(prompt) - p.PartTokens*kvindex.BytesPerToken
	a.ID, a.Endpoint, a.PromptTokens = id, EndpointName(ep), sv.tokens.Count(a.Model, textBytes)+p.PartTokens
	if own := kvindex.Tokens(len(prompt)); own > 0 {
		a.TokenScale = float64(a.PromptTokens) / float64(own) // cached blocks are cut in kvindex's tokens
	}
	var s uint64 // no seed: the prompt alone picks the embedded engine's text
	if seed != nil {
		s = uint64(*seed)
	}
	p.Req = engine.Request{
		ID:           id,
		Endpoint:     ep,
		Model:        a.Model,
		Body:         body,
		Prompt:       prompt,
		PromptTokens: kvindex.Tokens(len(prompt)),
		Blocks:       kvindex.AppendBlocks(nil, a.Model, prompt, journey.BlockTokens(sv.eng)),
		Stop:         p.Req.Stop,
		Seed:         s,
		Logprobs:     r.Logprobs,
		TopLogprobs:  r.TopLogprobs,
		Echo:         r.Echo,
		Roles:        r.Roles,
		Extra:        r.Extra,
	}
	return p, nil
}

// generation fills p's fields from the members chat and completion requests share.
func generation(p *journey.Request, g *openai.Generation) {
	a := &p.Adm
	a.Model, a.N, a.Temperature, a.TopP, a.StopCount = g.Model, g.N, g.Temperature, g.TopP, len(g.Stop)
	p.Req.Stop, p.User = g.Stop, g.User
	p.Stream = g.Stream
	p.IncludeUsage = g.Stream && g.StreamOptions != nil && g.StreamOptions.IncludeUsage
}

// decodeChat fills p's fields from a chat request's body and returns its rendered prompt and
// seed.
func (sv *Server) decodeChat(p *journey.Request, body []byte) ([]byte, *int64, *openai.Error) {
	a, r := &p.Adm, &p.Req
	cr, oerr := openai.DecodeChat(bytes.NewReader(body), sv.cfg.MaxBodyBytes)
	if oerr != nil {
		return nil, nil, oerr
	}
	generation(p, &cr.Generation)
	a.MaxTokens = cr.MaxCompletionTokens
	if a.MaxTokens == nil {
		a.MaxTokens = cr.MaxTokens
	} else {
		p.CapField = "max_completion_tokens"
	}
	if cr.Logprobs != nil && *cr.Logprobs {
		lp := 0
		if cr.TopLogprobs != nil {
			lp = *cr.TopLogprobs
		}
		a.Logprobs = &lp
	}
	r.Logprobs = a.Logprobs != nil
	if r.Logprobs {
		r.TopLogprobs = *a.Logprobs
	}
	r.Extra = extraFields(cr.Extra, cr.StreamOptions)
	msgs := make([]kvindex.Message, len(cr.Messages))
	r.Roles = make([]string, len(cr.Messages))
	for i, m := range cr.Messages {
		parts, tokens := mediaParts(m.Content.Media)
		msgs[i] = kvindex.Message{Role: m.Role, Content: m.Text(), Parts: parts}
		p.PartTokens += tokens
		r.Roles[i] = m.Role
		// Parts other than text are the engine's to run (images and audio are also in the
		// prompt, as their placeholders): an external engine reads them in Body, the embedded
		// one checks them by this name.
		for _, part := range m.Content.Parts {
			r.Extra = append(r.Extra, openai.Field{Name: fmt.Sprintf("messages[%d].content", i), Value: part})
		}
	}
	if oerr := sv.checkPartTokens(a.Model, p.PartTokens); oerr != nil {
		return nil, nil, oerr
	}
	return kvindex.RenderChat(nil, msgs), cr.Seed, nil
}

// checkPartTokens refuses, before their placeholders are rendered, images and audio whose
// estimates alone pass the model's context (kvindex.MaxPartTokens for a model the node does not
// know, which admission then refuses): a body of small parts would otherwise render into a
// prompt a thousand times its size.
func (sv *Server) checkPartTokens(model string, tokens int) *openai.Error {
	limit, _ := sv.host.MeshModelInfo(model)
	if limit <= 0 {
		limit = kvindex.MaxPartTokens
	}
	if tokens <= limit {
		return nil
	}
	return openai.ErrContextLengthExceeded(fmt.Sprintf(
		"the messages' images and audio alone count %d tokens at kvmesh's estimates; the context is %d tokens", tokens, limit))
}

// mediaParts is the prefix rule's view of a message's images and audio clips, and the
// tokens they stand for.
func mediaParts(media []openai.Media) ([]kvindex.Part, int) {
	if len(media) == 0 {
		return nil, 0
	}
	parts := make([]kvindex.Part, len(media))
	sum := 0
	for i, m := range media {
		t := kvindex.ImageTokens(m.Detail)
		if m.Type == openai.PartAudio {
			t = kvindex.AudioTokens(m.Format, m.Source)
		}
		parts[i] = kvindex.Part{At: m.At, ID: kvindex.PartID(m.Source), Tokens: t}
		sum += kvindex.PartBytes(parts[i]) / kvindex.BytesPerToken
	}
	return parts, sum
}

// decodeCompletion fills p's fields from a completions request's body and returns its prompt
// and seed.
func (sv *Server) decodeCompletion(p *journey.Request, body []byte) ([]byte, *int64, *openai.Error) {
	a, r := &p.Adm, &p.Req
	cr, oerr := openai.DecodeCompletion(bytes.NewReader(body), sv.cfg.MaxBodyBytes)
	if oerr != nil {
		return nil, nil, oerr
	}
	generation(p, &cr.Generation)
	a.MaxTokens, a.Logprobs = cr.MaxTokens, cr.Logprobs
	if cr.Logprobs != nil {
		r.Logprobs, r.TopLogprobs = true, *cr.Logprobs
	}
	r.Echo = cr.Echo != nil && *cr.Echo
	r.Extra = extraFields(cr.Extra, cr.StreamOptions)
	return []byte(cr.PromptText()), cr.Seed, nil
}

// ClientKVTransfer refuses a client's kv_transfer_params (null is absent): the KV connector's
// parameters are kvmesh's to set on a split request's halves, and from a client they would
// have an engine with a connector pull KV from whatever host they name. A kvmesh engine
// (Standalone) takes them, from the node that plays vLLM's proxy.
func (sv *Server) ClientKVTransfer(extra []openai.Field) *openai.Error {
	if sv.cfg.Standalone || !slices.ContainsFunc(extra, func(f openai.Field) bool {
		return f.Name == "kv_transfer_params" && string(bytes.TrimSpace(f.Value)) != "null"
	}) {
		return nil
	}
	return openai.NewError(http.StatusBadRequest, openai.CodeInvalidParameter,
		"kv_transfer_params is set by kvmesh on split requests, never by a client").WithParam("kv_transfer_params")
}

// extraFields lists the members of a request kvmesh does not read, stream_options' after the
// top level's as "stream_options.NAME", for the engine to honour or refuse.
func extraFields(top openai.Fields, so *openai.StreamOptions) []openai.Field {
	if so == nil || len(so.Extra) == 0 {
		return top
	}
	out := make([]openai.Field, 0, len(top)+len(so.Extra))
	out = append(out, top...)
	for _, f := range so.Extra {
		out = append(out, openai.Field{Name: "stream_options." + f.Name, Value: f.Value})
	}
	return out
}

// Account counts o under the endpoint label (endpointName, or the Messages API's).
func (sv *Server) Account(label string, o journey.Outcome) {
	switch {
	case o.Completed:
		sv.m.Completed.WithLabelValues(label).Inc()
	case o.Refused:
		sv.m.Refused.WithLabelValues(MetricCode(o.Code)).Inc()
	default:
		sv.m.Failed.WithLabelValues(MetricCode(o.Code)).Inc()
	}
}

// knownCodes are the refusal and failure codes kvmesh itself gives.
var knownCodes = []string{
	openai.CodeInvalidRequest, openai.CodeInvalidParameter, openai.CodeUnsupportedParameter, openai.CodeBodyTooLarge, openai.CodeBodyTimeout,
	openai.CodeUnsupportedMediaType,
	openai.CodeModelNotFound, openai.CodeContextLengthExceeded, openai.CodeInvalidAPIKey, openai.CodeRateLimited,
	openai.CodeQueueFull, openai.CodeNoCapacity, openai.CodeEngineError, openai.CodeEngineTimeout, openai.CodeClientClosed,
	admit.CodeKVBudget, admit.CodeQueueTTLExpired, admit.CodeSLOUnattainable, plan.CodeCarbonDeferred, journey.CodeAgentPaused,
	journey.CodeDraining, CodeNotFound, CodeMethodNotAllowed, external.CodeEngineOverloaded, journey.CodeHopLimit,
	transport.CodeVersion, transport.CodeKind, CodeUnsupportedEndpoint, CodePreviousResponseNotFound,
	journey.CodeOwnerUnreachable, attempt.CodeWrongRole, attempt.CodeDecodeUnavailable, attempt.CodeDecodeFailed, journey.CodeIngressMismatch,
}

// codeEngineRejected labels, in the metrics, a refusal with an external engine's own code:
// the client gets the engine's code, the counters a bounded label set.
const codeEngineRejected = "engine_rejected"

// MetricCode is code as a metric label: one of kvmesh's own, else codeEngineRejected.
func MetricCode(code string) string {
	if slices.Contains(knownCodes, code) {
		return code
	}
	return codeEngineRejected
}

func (sv *Server) HandleGenerate(ep engine.Endpoint) http.HandlerFunc {
	return sv.HandleCounted(EndpointName(ep), func(ctx context.Context, w http.ResponseWriter, r *http.Request, id string, start time.Time) journey.Outcome {
		return sv.ingest(ctx, w, r, ep, id, start)
	})
}

// HandleCounted runs one request of an inference endpoint (chat, completions, the Messages
// API, the simple endpoints) under its trace span, counted under label in the request
// counters.
func (sv *Server) HandleCounted(label string, ingest IngestFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sv.m.Received.WithLabelValues(label).Inc()
		sv.m.InFlight.Inc()
		defer sv.m.InFlight.Dec()
		id := NewRequestID()
		w.Header().Set(journey.HeaderRequestID, id)
		ctx, span := sv.spans.Request(r, label, id)
		defer span.End()
		o := ingest(ctx, w, r, id, start)
		journey.EndOutcome(span, o)
		sv.Account(label, o)
		sv.m.E2E.Observe(time.Since(start).Seconds())
		if !o.Completed {
			sv.log.Info("request ended", "id", id, "endpoint", label, "code", o.Code, "refused", o.Refused)
		}
	}
}
