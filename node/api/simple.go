package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/node/engine/external"
	"github.com/kvmesh/kvmesh/node/journey"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/tracing"
	"github.com/kvmesh/kvmesh/node/transport"
)

// POST /v1/embeddings and POST /v1/responses take a simpler path than generation: decode,
// validate, identity (API key, rate), then the least loaded node that serves the model, this
// one or a peer over QUIC, tried in turn as a generation's candidates are. There is no
// KV prefix to follow, no SLO, no waiting room and no agent window: a request no candidate
// takes is a 503 no_capacity at once. A node in front of an external engine hands the body to
// its engine as sent and relays the answer; the embedded engine computes embeddings itself
// (sim.Embedding) and refuses the Responses API (CodeUnsupportedEndpoint).

// HandleSimple counts and runs one request of a simple endpoint under its trace span, as
// HandleCounted does a generation.
func (sv *Server) HandleSimple(ep transport.Endpoint, ingest IngestFunc) http.HandlerFunc {
	return sv.HandleCounted(ep.String(), ingest)
}

// simpleRequest is a decoded request of a simple endpoint.
type simpleRequest struct {
	ep   transport.Endpoint
	id   string
	body []byte
	adm  admit.Request
}

// RefuseSimple writes e and returns its outcome.
func RefuseSimple(w http.ResponseWriter, e *openai.Error, retry time.Duration) journey.Outcome {
	journey.WriteRefusal(w, e, retry)
	return journey.Outcome{Code: e.Code, Refused: true}
}

// admitSimple runs validation (the X-Kvmesh-* headers, a model the mesh serves) and identity
// (API key and its token bucket, charged the input's tokens and output, the default output
// when output is nil) on q.
// The decision, model, priority and tenant go on ctx's request span.
func (sv *Server) admitSimple(ctx context.Context, w http.ResponseWriter, r *http.Request, q *simpleRequest, start time.Time, output *int) *journey.Outcome {
	span := trace.SpanFromContext(ctx)
	refuse := func(e *openai.Error, retry time.Duration) *journey.Outcome {
		o := RefuseSimple(w, e, retry)
		return &o
	}
	refused := func(d admit.Decision) *openai.Error {
		sv.m.DecisionOf(d)
		tracing.Decision(span, d.Action.String(), d.Layer, d.Code)
		return journey.RefusalOf(d)
	}
	a := &q.adm
	tracing.Model(span, a.Model)
	if oerr := ParseHeaders(r.Header, a, sv.cfg.MaxAgentIDBytes); oerr != nil {
		sv.m.Decision(admit.LayerValidation, admit.Refuse, oerr.Code)
		tracing.Decision(span, admit.Refuse.String(), admit.LayerValidation, oerr.Code)
		return refuse(oerr, 0)
	}
	a.ID, a.Endpoint, a.Arrived, a.APIKey = q.id, q.ep.String(), start, Bearer(r.Header)
	if d := sv.adm.Validate(*a); d.Refused() {
		return refuse(refused(d), 0)
	}
	a.MaxTokens = output
	tenant, d := sv.adm.Identify(start, *a)
	if d.Refused() {
		return refuse(refused(d), d.RetryAfter)
	}
	a.Tenant, a.Priority, a.APIKey = tenant, d.Priority, ""
	tracing.RequestAttrs(span, a.Model, a.Priority, a.Tenant)
	if d.PriorityClamped {
		w.Header().Set(HeaderPriorityGranted, strconv.Itoa(d.Priority))
	}
	if output != nil && *output > 0 {
		// An output cap (the Responses API's max_output_tokens) meets the limits a
		// generation's max_tokens does: refused past the context or the route's limit, or
		// lowered to it with clamp_max_tokens, in the body the engine gets too.
		bd := sv.adm.Budget(*a)
		if bd.Refused() {
			e := refused(bd)
			if e.Param == "max_tokens" {
				e.Param, e.Message = "max_output_tokens", strings.Replace(e.Message, "max_tokens", "max_output_tokens", 1)
			}
			return refuse(e, 0)
		}
		if bd.MaxTokens < *output {
			v := []byte(strconv.Itoa(bd.MaxTokens))
			body, err := openai.SetMember(q.body, "max_output_tokens", func([]byte) []byte { return v })
			if err != nil {
				return refuse(openai.NewError(http.StatusBadRequest, openai.CodeInvalidRequest, "request body must be a JSON object"), 0)
			}
			q.body = body
		}
	}
	return nil
}

// simpleCandidate is a node a simple request may run on.
type simpleCandidate struct {
	name    string
	quic    string // "" for this node
	self    bool
	busy    float64 // running and waiting requests over the engine's cap
	prefill int     // queued prefill tokens
}

// simpleCandidates lists the healthy nodes that serve model, least loaded first (this node
// first among equals: no hop), and whether some healthy node serves it on the embedded engine
// when external is set and only nodes in front of an external engine are listed.
func (sv *Server) simpleCandidates(model string, external bool) (out []simpleCandidate, embedded bool) {
	add := func(m *gossip.Member, quic string) {
		s := &m.State
		if !s.EngineHealthy || !slices.ContainsFunc(s.Models, func(mi gossip.ModelInfo) bool { return mi.Name == model }) {
			return
		}
		if external && s.EngineKind == "sim" {
			embedded = true
			return
		}
		out = append(out, simpleCandidate{name: m.Name, quic: quic, self: m.Self,
			busy: float64(s.Running+s.Waiting) / float64(max(s.MaxRunning, 1)), prefill: s.QueuedPrefillTokens})
	}
	self := gossip.Member{Name: sv.cfg.Name, Self: true, State: sv.host.LocalState()}
	add(&self, "")
	if sv.g != nil {
		for _, m := range sv.g.Members() {
			if !m.Self && m.Candidate {
				add(&m, m.State.QUICAddr)
			}
		}
	}
	slices.SortStableFunc(out, func(a, b simpleCandidate) int {
		switch {
		case a.busy != b.busy:
			return cmpFloat(a.busy, b.busy)
		case a.prefill != b.prefill:
			return a.prefill - b.prefill
		case a.self != b.self:
			if a.self {
				return -1
			}
			return 1
		}
		return strings.Compare(a.name, b.name)
	})
	return out, embedded
}

func cmpFloat(a, b float64) int {
	if a < b {
		return -1
	}
	return 1
}

// dispatchSimple runs q on the first of cands that takes it: local runs it here, a peer over
// QUIC. An owner's refusal, an unreachable owner or a failed engine before any byte moves on
// to the next candidate, up to ForwardAttempts; with pinned set (a response's owner) the
// owner's answer, whatever it is, is the client's.
func (sv *Server) dispatchSimple(ctx context.Context, w http.ResponseWriter, q *simpleRequest, cands []simpleCandidate, pinned bool, local func(http.ResponseWriter, string) journey.Outcome) journey.Outcome {
	last, retry := admit.CodeNoCapacity, time.Duration(0)
	for i, c := range cands {
		if i >= sv.cfg.ForwardAttempts {
			break
		}
		if c.self {
			sv.m.Forwards.WithLabelValues("local").Inc()
			tracing.Peer(trace.SpanFromContext(ctx), c.name)
			return local(w, "local")
		}
		if o, done := sv.forwardSimple(ctx, w, q, c, pinned, &last, &retry); done {
			return o
		}
		if ctx.Err() != nil {
			return journey.Outcome{Code: openai.CodeClientClosed, Refused: true}
		}
	}
	if retry == 0 {
		retry = sv.planner.Config().RetryAfter
	}
	msg := fmt.Sprintf("no node could take the %s request for model %q", q.ep, q.adm.Model)
	if last != admit.CodeNoCapacity {
		msg += " (last refusal: " + last + ")"
	}
	return RefuseSimple(w, openai.NewError(http.StatusServiceUnavailable, admit.CodeNoCapacity, msg), retry)
}

// forwardSimple sends q to candidate c. done reports that the client got an answer.
func (sv *Server) forwardSimple(ctx context.Context, w http.ResponseWriter, q *simpleRequest, c simpleCandidate, pinned bool, last *string, retry *time.Duration) (journey.Outcome, bool) {
	if c.quic == "" {
		sv.m.Forwards.WithLabelValues("no_address").Inc()
		return journey.Outcome{}, false
	}
	h := transport.Header{
		Kind:      transport.KindRequest,
		Endpoint:  q.ep,
		RequestID: q.id,
		Hops:      1,
		Priority:  q.adm.Priority,
		Tenant:    q.adm.Tenant,
		Ingress:   sv.cfg.Name,
	}
	sv.forwardSent(c.name)
	resp, err := sv.tr.Forward(ctx, c.quic, h, q.body)
	var ref *transport.Refusal
	switch {
	case err == nil:
	case errors.As(err, &ref):
		sv.m.Forwards.WithLabelValues("refused").Inc()
		sv.log.Debug("owner refused", "id", q.id, "owner", c.name, "code", ref.Code)
		*last, *retry = ref.Code, ref.RetryAfter
		if pinned || ref.Status == http.StatusBadRequest {
			// The request itself is at fault (no other node thinks otherwise), or only this
			// owner can run it.
			return RefuseSimple(w, openai.NewError(ref.Status, ref.Code, ref.Message), ref.RetryAfter), true
		}
		return journey.Outcome{}, false
	default:
		sv.m.Forwards.WithLabelValues("unreachable").Inc()
		sv.log.Info("owner unreachable", "id", q.id, "owner", c.name, "err", err)
		if pinned {
			return RefuseSimple(w, openai.NewError(http.StatusServiceUnavailable, admit.CodeNoCapacity,
				"node "+c.name+", which holds the previous response, cannot be reached"), sv.planner.Config().RetryAfter), true
		}
		return journey.Outcome{}, false
	}
	if resp.Status >= 500 && !pinned {
		_ = resp.Body.Close()
		sv.m.Forwards.WithLabelValues("owner_failed").Inc()
		*last = resp.Headers[journey.HeaderReason]
		return journey.Outcome{}, false
	}
	sv.m.Forwards.WithLabelValues("accepted").Inc()
	tracing.Peer(trace.SpanFromContext(ctx), c.name)
	return sv.relaySimple(w, resp), true
}

// relaySimple copies an owner's answer to the client as it arrives.
func (sv *Server) relaySimple(w http.ResponseWriter, resp *transport.Response) journey.Outcome {
	defer resp.Body.Close()
	for k, v := range resp.Headers {
		if !journey.IngressHeader(k) {
			w.Header().Set(k, v)
		}
	}
	w.WriteHeader(resp.Status)
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		nr, err := resp.Body.Read(buf)
		if nr > 0 {
			if _, werr := w.Write(buf[:nr]); werr != nil {
				return journey.Outcome{Code: openai.CodeClientClosed}
			}
			_ = rc.Flush()
		}
		switch {
		case err == io.EOF && resp.Status < 300:
			return journey.Outcome{Completed: true}
		case err == io.EOF:
			return journey.Outcome{Code: resp.Headers[journey.HeaderReason], Refused: resp.Status < 500}
		case err != nil:
			// The answer is cut short; the client sees a body that does not parse or a stream
			// without its last event.
			sv.log.Info("owner failed mid-response", "err", err)
			return journey.Outcome{Code: openai.CodeEngineError}
		}
	}
}

// ServeSimpleForward runs a simple request a peer forwarded here, on this node's engine.
func (sv *Server) ServeSimpleForward(ctx context.Context, h transport.Header, body []byte, fw transport.ResponseWriter, refuse func(status int, code, msg string, retry time.Duration)) {
	w := transport.HTTPResponseWriter(fw)
	switch h.Endpoint {
	case transport.EndpointEmbeddings:
		er, oerr := openai.DecodeEmbeddings(bytes.NewReader(body), sv.cfg.MaxBodyBytes)
		if oerr == nil {
			oerr = sv.servedHere(er.Model)
		}
		if oerr != nil {
			refuse(oerr.Status, oerr.Code, oerr.Message, 0)
			return
		}
		sv.serveEmbeddings(ctx, w, er, body, h.RequestID, "peer")
	case transport.EndpointResponses:
		rr, oerr := openai.DecodeResponses(bytes.NewReader(body), sv.cfg.MaxBodyBytes)
		if oerr == nil {
			oerr = sv.servedHere(rr.Model)
		}
		if oerr != nil {
			refuse(oerr.Status, oerr.Code, oerr.Message, 0)
			return
		}
		sv.serveResponses(ctx, w, rr, body, h.RequestID, "peer")
	}
}

// servedHere is nil when this node's engine serves model, else the 404 a forward for it gets.
func (sv *Server) servedHere(model string) *openai.Error {
	if _, ok := sv.host.LocalModel(model); !ok {
		return openai.NewError(http.StatusNotFound, admit.CodeModelNotFound, "this node does not serve "+model)
	}
	return nil
}

// maxEngineError bounds the engine's error body the node reads to learn its code.
const maxEngineError = 64 << 10

// passToEngine posts body to path on the external engine and relays its answer: a 2xx or 4xx
// with its status, content type and body as the engine sent them (a 4xx's code in
// X-Kvmesh-Reason), a 5xx, or a 401 or 403 (the engine wants credentials the node does not
// send), as 502 engine_error. rewrite, if set, may transform a 2xx body on its way (see
// responseIDs).
func (sv *Server) passToEngine(ctx context.Context, w http.ResponseWriter, path, id string, body []byte, rewrite func(body io.Reader, contentType string) io.Reader) journey.Outcome {
	resp, err := sv.ext.Post(ctx, path, id, body)
	if err != nil {
		if ctx.Err() != nil {
			return journey.Outcome{Code: openai.CodeClientClosed}
		}
		e := openai.ErrEngine("engine failed before answering: " + err.Error())
		journey.WriteRefusal(w, e, 0)
		return journey.Outcome{Code: e.Code}
	}
	defer resp.Body.Close()
	var src io.Reader = resp.Body
	var code string
	if resp.StatusCode >= 300 {
		eb, _ := io.ReadAll(io.LimitReader(resp.Body, maxEngineError))
		ae := external.ErrorOf(resp.StatusCode, eb).APIError()
		if ae.Status >= 500 {
			journey.WriteRefusal(w, ae, 0)
			return journey.Outcome{Code: ae.Code}
		}
		code = ae.Code
		w.Header().Set(journey.HeaderReason, code)
		src = io.MultiReader(bytes.NewReader(eb), resp.Body)
	} else if rewrite != nil {
		src = rewrite(resp.Body, resp.Header.Get("Content-Type"))
	}
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	w.Header().Set(journey.HeaderNode, sv.cfg.Name)
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		nr, err := src.Read(buf)
		if nr > 0 {
			if _, werr := w.Write(buf[:nr]); werr != nil {
				return journey.Outcome{Code: openai.CodeClientClosed}
			}
			_ = rc.Flush()
		}
		switch {
		case err == io.EOF && code == "":
			return journey.Outcome{Completed: true}
		case err == io.EOF:
			return journey.Outcome{Code: code, Refused: true}
		case err != nil:
			sv.log.Info("engine failed mid-answer", "id", id, "err", err)
			e := sv.x.DrainCut(ctx)
			if e == nil && ctx.Err() != nil {
				return journey.Outcome{Code: openai.CodeClientClosed}
			}
			if e == nil {
				e = openai.NewError(http.StatusBadGateway, openai.CodeEngineError, "the engine failed mid-answer: "+err.Error())
			}
			if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
				// A stream says it is cut short; a JSON body cut short does not parse.
				_ = openai.NewSSEWriter(w).WriteError(e)
			}
			return journey.Outcome{Code: e.Code}
		}
	}
}
