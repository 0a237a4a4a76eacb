package node

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
	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/engine/external"
	"github.com/kvmesh/kvmesh/node/firsttoken"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/transport"
)

// Response headers.
const (
	HeaderNode = "X-Kvmesh-Node"
	// HeaderPrefillNode names, on a split request's response, the node that ran its prefill
	// half (HeaderNode is then the decode node; a decode_unavailable or decode_failed error
	// has it too). The ingress sets it once the prompt is handed over; a request run whole
	// never carries it.
	HeaderPrefillNode = "X-Kvmesh-Prefill-Node"
	HeaderRequestID   = "X-Kvmesh-Request-Id"
	HeaderReason      = "X-Kvmesh-Reason"
)

// prepared is a decoded request ready to admit and run: the same function builds it at the
// ingress and, from the forwarded body, on the owner, so both agree on its blocks (and on its
// prompt tokens as far as their learned bytes per token agree).
type prepared struct {
	endpoint     engine.Endpoint
	stream       bool
	includeUsage bool
	user         string
	model        engine.Model
	req          engine.Request
	adm          admit.Request // the fields admission checks (the node adds headers and identity)
	agentFinal   bool          // HeaderAgentFinal: the agent's last step
	parked       parking       // the home whose agent window parked this step, while it waits here
	// capField is the body's name for the output cap admission calls max_tokens: chat's
	// max_completion_tokens when the client sent it, else "" (max_tokens).
	capField string
	// due is when the engine that runs the request must have given its first token (a prefill
	// half its handover): its queue TTL, ttl, after its arrival at the ingress (firsttoken.go).
	// Zero: no bound (kvmesh engine, which is an engine like vLLM; a forward from a node
	// built before the bound).
	due time.Time
	ttl time.Duration
	// renewed: due was renewed once for a rerun (renewDue).
	renewed bool
	// A request whose owner failed mid-response moves on (migrate.go): origin is the client's
	// request a continuation continues (nil for the client's own), migrations counts the
	// moves begun for the client's request, and exclude lists the owners that failed it.
	origin     *prepared
	migrations int
	exclude    []string
	// partTokens are the tokens the prompt's images and audio stand for (their placeholders'
	// share of the rendered prompt).
	partTokens int
	// moveBreak: the caller of a local run moves the request elsewhere when this node's
	// engine fails (outcome.broke), so serveLocal leaves that failure unwritten.
	moveBreak bool
	// adapterRouted: kvmesh_route_adapter_requests_total counted the request (decide).
	adapterRouted bool
	// native is a Messages request's body as the client sent it, for an engine that serves
	// the Messages API natively (messages_native.go); nil for every other request.
	native []byte
}

func endpointName(ep engine.Endpoint) string {
	if ep == engine.Completion {
		return "completions"
	}
	return "chat"
}

func newRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// readBody reads r's body: at most MaxBodyBytes (413 above) within BodyTimeout (408 past it),
// and not encoded (415): the node reads the JSON itself, so a compressed body would otherwise
// be refused as malformed, and an encoding named over a plain body be forwarded as a lie.
func (n *Node) readBody(r *http.Request) ([]byte, *openai.Error) {
	for _, v := range r.Header.Values("Content-Encoding") {
		for ce := range strings.SplitSeq(v, ",") {
			if ce = strings.TrimSpace(ce); ce != "" && !strings.EqualFold(ce, "identity") {
				return nil, openai.NewError(http.StatusUnsupportedMediaType, openai.CodeUnsupportedMediaType,
					fmt.Sprintf("Content-Encoding %q is not supported: send the body uncompressed", ce)).WithParam("Content-Encoding")
			}
		}
	}
	limit := n.cfg.MaxBodyBytes
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil, openai.NewError(http.StatusRequestTimeout, openai.CodeBodyTimeout,
			fmt.Sprintf("the request body did not arrive within %v", n.cfg.BodyTimeout))
	case err != nil:
		return nil, openai.NewError(http.StatusBadRequest, openai.CodeInvalidRequest, "reading request body: "+err.Error())
	case int64(len(body)) > limit:
		return nil, openai.NewError(http.StatusRequestEntityTooLarge, openai.CodeBodyTooLarge,
			fmt.Sprintf("request body is larger than %d bytes", limit))
	}
	return body, nil
}

// prepare decodes body, renders the prompt and hashes its blocks. Bounds, the model and the
// context budget are admission's to check.
func (n *Node) prepare(ep engine.Endpoint, id string, body []byte) (*prepared, *openai.Error) {
	p := &prepared{endpoint: ep}
	var (
		seed   *int64
		prompt []byte
		oerr   *openai.Error
		a      = &p.adm
		r      = &p.req // what the engine needs beyond the prompt; the literal below keeps it
	)
	if ep == engine.Chat {
		prompt, seed, oerr = n.decodeChat(p, body)
	} else {
		prompt, seed, oerr = n.decodeCompletion(p, body)
	}
	if oerr != nil {
		return nil, oerr
	}
	mm, _ := n.meshModel(a.Model)
	p.model = engine.Model{Name: a.Model, ContextTokens: mm.ContextTokens}
	a.Parent = mm.Parent // an adapter's request runs on its base model's nodes (route.Request.Parent)
	// Admission counts the prompt's text in the model's own tokens, as far as this node or
	// the mesh has learned them (promptTokens), and its images and audio at their estimates;
	// the engine's request keeps kvindex's count, the blocks' unit.
	textBytes := len(prompt) - p.partTokens*kvindex.BytesPerToken
	a.ID, a.Endpoint, a.PromptTokens = id, endpointName(ep), n.promptTokens(a.Model, textBytes)+p.partTokens
	if own := kvindex.Tokens(len(prompt)); own > 0 {
		a.TokenScale = float64(a.PromptTokens) / float64(own) // cached blocks are cut in kvindex's tokens
	}
	var s uint64 // no seed: the prompt alone picks the embedded engine's text
	if seed != nil {
		s = uint64(*seed)
	}
	p.req = engine.Request{
		ID:           id,
		Endpoint:     ep,
		Model:        a.Model,
		Body:         body,
		Prompt:       prompt,
		PromptTokens: kvindex.Tokens(len(prompt)),
		Blocks:       kvindex.AppendBlocks(nil, a.Model, prompt, n.blockTokens()),
		Stop:         p.req.Stop,
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
func generation(p *prepared, g *openai.Generation) {
	a := &p.adm
	a.Model, a.N, a.Temperature, a.TopP, a.StopCount = g.Model, g.N, g.Temperature, g.TopP, len(g.Stop)
	p.req.Stop, p.user = g.Stop, g.User
	p.stream = g.Stream
	p.includeUsage = g.Stream && g.StreamOptions != nil && g.StreamOptions.IncludeUsage
}

// decodeChat fills p's fields from a chat request's body and returns its rendered prompt and
// seed.
func (n *Node) decodeChat(p *prepared, body []byte) ([]byte, *int64, *openai.Error) {
	a, r := &p.adm, &p.req
	cr, oerr := openai.DecodeChat(bytes.NewReader(body), n.cfg.MaxBodyBytes)
	if oerr != nil {
		return nil, nil, oerr
	}
	generation(p, &cr.Generation)
	a.MaxTokens = cr.MaxCompletionTokens
	if a.MaxTokens == nil {
		a.MaxTokens = cr.MaxTokens
	} else {
		p.capField = "max_completion_tokens"
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
		p.partTokens += tokens
		r.Roles[i] = m.Role
		// Parts other than text are the engine's to run (images and audio are also in the
		// prompt, as their placeholders): an external engine reads them in Body, the embedded
		// one checks them by this name.
		for _, part := range m.Content.Parts {
			r.Extra = append(r.Extra, openai.Field{Name: fmt.Sprintf("messages[%d].content", i), Value: part})
		}
	}
	if oerr := n.checkPartTokens(a.Model, p.partTokens); oerr != nil {
		return nil, nil, oerr
	}
	return kvindex.RenderChat(nil, msgs), cr.Seed, nil
}

// checkPartTokens refuses, before their placeholders are rendered, images and audio whose
// estimates alone pass the model's context (kvindex.MaxPartTokens for a model the node does not
// know, which admission then refuses): a body of small parts would otherwise render into a
// prompt a thousand times its size.
func (n *Node) checkPartTokens(model string, tokens int) *openai.Error {
	limit, _ := n.meshModelInfo(model)
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
func (n *Node) decodeCompletion(p *prepared, body []byte) ([]byte, *int64, *openai.Error) {
	a, r := &p.adm, &p.req
	cr, oerr := openai.DecodeCompletion(bytes.NewReader(body), n.cfg.MaxBodyBytes)
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

// clientKVTransfer refuses a client's kv_transfer_params (null is absent): the KV connector's
// parameters are kvmesh's to set on a split request's halves, and from a client they would
// have an engine with a connector pull KV from whatever host they name. A kvmesh engine
// (Standalone) takes them, from the node that plays vLLM's proxy.
func (n *Node) clientKVTransfer(extra []openai.Field) *openai.Error {
	if n.cfg.Standalone || !slices.ContainsFunc(extra, func(f openai.Field) bool {
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

func (n *Node) blockTokens() int {
	if st := n.eng.State(); st.BlockTokens > 0 {
		return st.BlockTokens
	}
	return kvindex.DefaultBlockTokens
}

// outcome is how one request ended, for the reconciling counters.
type outcome struct {
	completed bool
	code      string // error code when not completed
	refused   bool   // refused before the first byte (else failed)
	// broke is the failure of this node's engine that serveLocal left unwritten (p.moveBreak):
	// before anything reached w (begun false), or after the response began (a stream).
	broke *openai.Error
	begun bool
}

// account counts o under the endpoint label (endpointName, or the Messages API's).
func (n *Node) account(label string, o outcome) {
	switch {
	case o.completed:
		n.m.completed.WithLabelValues(label).Inc()
	case o.refused:
		n.m.refused.WithLabelValues(metricCode(o.code)).Inc()
	default:
		n.m.failed.WithLabelValues(metricCode(o.code)).Inc()
	}
}

// knownCodes are the refusal and failure codes kvmesh itself gives.
var knownCodes = []string{
	openai.CodeInvalidRequest, openai.CodeInvalidParameter, openai.CodeUnsupportedParameter, openai.CodeBodyTooLarge, openai.CodeBodyTimeout,
	openai.CodeUnsupportedMediaType,
	openai.CodeModelNotFound, openai.CodeContextLengthExceeded, openai.CodeInvalidAPIKey, openai.CodeRateLimited,
	openai.CodeQueueFull, openai.CodeNoCapacity, openai.CodeEngineError, openai.CodeEngineTimeout, openai.CodeClientClosed,
	admit.CodeKVBudget, admit.CodeQueueTTLExpired, admit.CodeSLOUnattainable, CodeCarbonDeferred, CodeAgentPaused,
	CodeDraining, CodeNotFound, CodeMethodNotAllowed, external.CodeEngineOverloaded, CodeHopLimit,
	transport.CodeVersion, transport.CodeKind, CodeUnsupportedEndpoint, CodePreviousResponseNotFound,
	CodeOwnerUnreachable, CodeWrongRole, CodeDecodeUnavailable, CodeDecodeFailed, CodeIngressMismatch,
}

// codeEngineRejected labels, in the metrics, a refusal with an external engine's own code:
// the client gets the engine's code, the counters a bounded label set.
const codeEngineRejected = "engine_rejected"

// metricCode is code as a metric label: one of kvmesh's own, else codeEngineRejected.
func metricCode(code string) string {
	if slices.Contains(knownCodes, code) {
		return code
	}
	return codeEngineRejected
}

func (n *Node) handleGenerate(ep engine.Endpoint) http.HandlerFunc {
	return n.handleCounted(endpointName(ep), func(ctx context.Context, w http.ResponseWriter, r *http.Request, id string, start time.Time) outcome {
		return n.ingest(ctx, w, r, ep, id, start)
	})
}

// handleCounted runs one request of a generation endpoint (chat, completions, the Messages API)
// under its trace span, counted under label in the request counters.
func (n *Node) handleCounted(label string, ingest ingestFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		n.m.received.WithLabelValues(label).Inc()
		n.m.inFlight.Inc()
		defer n.m.inFlight.Dec()
		id := newRequestID()
		w.Header().Set(HeaderRequestID, id)
		ctx, span := n.startRequest(r, label, id)
		defer span.End()
		o := ingest(ctx, w, r, id, start)
		endOutcome(span, o)
		n.account(label, o)
		n.m.e2e.Observe(time.Since(start).Seconds())
		if !o.completed {
			n.log.Info("request ended", "id", id, "endpoint", label, "code", o.code, "refused", o.refused)
		}
	}
}

// writeRefusal answers with an OpenAI error body, X-Kvmesh-Reason and, for 429 and 503,
// Retry-After in whole seconds (at least 1).
func writeRefusal(w http.ResponseWriter, e *openai.Error, retryAfter time.Duration) {
	h := w.Header()
	h.Set(HeaderReason, e.Code)
	if e.Status == http.StatusTooManyRequests || e.Status == http.StatusServiceUnavailable {
		secs := int((retryAfter + time.Second - 1) / time.Second)
		h.Set("Retry-After", fmt.Sprint(max(secs, 1)))
	}
	openai.WriteError(w, e)
}

// engineError maps an error from Engine.Generate (before any output) to the client's answer.
// A field the engine refused is a 400 naming it. An external engine's HTTP error says itself
// what the client gets (external.StatusError's APIError): a 4xx keeps its status, message,
// param and code; a 5xx is a 502 engine_error.
func engineError(err error) *openai.Error {
	var pe *engine.ParamError
	var ae interface{ APIError() *openai.Error }
	switch {
	case errors.As(err, &pe) && pe.Unsupported:
		return openai.NewError(http.StatusBadRequest, openai.CodeUnsupportedParameter,
			fmt.Sprintf("unsupported parameter %q: %s", pe.Param, pe.Reason)).WithParam(pe.Param)
	case errors.As(err, &pe):
		return openai.NewError(http.StatusBadRequest, openai.CodeInvalidParameter,
			fmt.Sprintf("invalid parameter %q: %s", pe.Param, pe.Reason)).WithParam(pe.Param)
	case errors.As(err, &ae):
		return ae.APIError()
	case errors.As(err, new(*firsttoken.Late)):
		return openai.ErrEngineTimeout(err.Error())
	case errors.Is(err, engine.ErrRejected):
		return openai.NewError(http.StatusBadRequest, openai.CodeInvalidRequest, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return openai.NewError(http.StatusGatewayTimeout, openai.CodeEngineTimeout, "engine did not answer in time")
	default:
		return openai.NewError(http.StatusBadGateway, openai.CodeEngineError, "engine failed before the first token: "+err.Error())
	}
}
