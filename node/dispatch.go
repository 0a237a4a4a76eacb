package node

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/agent"
	"github.com/kvmesh/kvmesh/admit/plan"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/journey"
	"github.com/kvmesh/kvmesh/node/openai"
)

// Request headers.
const (
	HeaderPriority = "X-Kvmesh-Priority"
	HeaderQueueTTL = "X-Kvmesh-Queue-TTL"
	HeaderTTFTSLO  = "X-Kvmesh-TTFT-SLO"
	HeaderTPOTSLO  = "X-Kvmesh-TPOT-SLO"
	HeaderAgent    = "X-Kvmesh-Agent"
	HeaderExplain  = journey.HeaderExplain
)

// HeaderPriorityGranted, on a response, is the priority the request ran at when its key (or
// the mesh's cap) allowed less than X-Kvmesh-Priority asked for.
const HeaderPriorityGranted = "X-Kvmesh-Priority-Granted"

// HeaderTTFTTarget and HeaderTPOTTarget, on an admitted request's response, are the targets the
// mesh held it to: the client's own, or its class default with the TTFT one fitted to its size.
const (
	HeaderTTFTTarget = journey.HeaderTTFTTarget
	HeaderTPOTTarget = journey.HeaderTPOTTarget
)

// CodeCarbonDeferred is the refusal of a sheddable request when every grid with room is dirty.
const CodeCarbonDeferred = plan.CodeCarbonDeferred

// parseHeaders fills the admission fields that come from X-Kvmesh-* headers.
func parseHeaders(h http.Header, a *admit.Request, maxAgent int) *openai.Error {
	bad := func(name string, err error) *openai.Error {
		return openai.NewError(http.StatusBadRequest, openai.CodeInvalidParameter, name+": "+err.Error()).WithParam(name)
	}
	var err error
	if a.Priority, err = admit.ParsePriority(h.Get(HeaderPriority)); err != nil {
		return bad(HeaderPriority, err)
	}
	for _, d := range []struct {
		name string
		dst  *time.Duration
	}{{HeaderQueueTTL, &a.QueueTTL}, {HeaderTTFTSLO, &a.TTFTSLO}, {HeaderTPOTSLO, &a.TPOTSLO}} {
		if v := h.Get(d.name); v != "" {
			if *d.dst, err = admit.ParseDuration(v); err != nil {
				return bad(d.name, err)
			}
		}
	}
	a.Agent = h.Get(HeaderAgent)
	if len(a.Agent) > maxAgent {
		return openai.NewError(http.StatusBadRequest, openai.CodeInvalidParameter,
			fmt.Sprintf("%s is longer than %d bytes", HeaderAgent, maxAgent)).WithParam(HeaderAgent)
	}
	return nil
}

// flagHeader reads a boolean X-Kvmesh-* header: on for 1 or true, off for none, 0 or false
// (case aside, as HTTP clients and proxies vary), ok false for anything else.
func flagHeader(v string) (on, ok bool) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true":
		return true, true
	case "", "0", "false":
		return false, true
	}
	return false, false
}

// bearer is the API key a request presents: its Authorization bearer token, else its
// X-Api-Key (the Messages API's header), so a client of either API authenticates as it does
// with its provider.
func bearer(h http.Header) string {
	v := h.Get("Authorization")
	if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
		return strings.TrimSpace(v[7:])
	}
	if v == "" {
		return strings.TrimSpace(h.Get(HeaderAPIKey))
	}
	return ""
}

// ingest runs one client request through the pipeline of docs/design/admission.md:
// authenticate, decode, validate, identity (the key's bucket), budget, route, admit, wait,
// dispatch.
func (n *Node) ingest(ctx context.Context, w http.ResponseWriter, r *http.Request, ep engine.Endpoint, id string, start time.Time) journey.Outcome {
	if o, ok := n.authenticate(w, r); !ok {
		return o
	}
	// The body must be JSON whatever Content-Type says: curl -d sends form encoding by default.
	body, oerr := n.readBody(r)
	if oerr != nil {
		n.m.Decision(admit.LayerValidation, admit.Refuse, oerr.Code)
		return refuseSimple(w, oerr, 0)
	}
	return n.ingestBody(ctx, w, r, ep, id, start, body)
}

// ingestBody is ingest once the request's body is read (for the Messages API, translated).
func (n *Node) ingestBody(ctx context.Context, w http.ResponseWriter, r *http.Request, ep engine.Endpoint, id string, start time.Time, body []byte) journey.Outcome {
	refuse := func(e *openai.Error, retry time.Duration) journey.Outcome {
		journey.WriteRefusal(w, e, retry)
		return journey.Outcome{Code: e.Code, Refused: true}
	}
	p, oerr := n.prepare(ep, id, body)
	if oerr == nil {
		oerr = n.clientKVTransfer(p.Req.Extra)
	}
	if oerr == nil {
		oerr = parseHeaders(r.Header, &p.Adm, n.cfg.MaxAgentIDBytes)
	}
	if oerr != nil {
		n.m.Decision(admit.LayerValidation, admit.Refuse, oerr.Code)
		return refuse(oerr, 0)
	}
	if ic, ok := w.(inputCounter); ok {
		ic.SetInputTokens(p.Adm.PromptTokens)
	}
	a := &p.Adm
	a.Arrived, a.APIKey = start, bearer(r.Header)
	if a.Agent == "" && n.cfg.AgentFromUser {
		a.Agent = p.User
	}
	switch on, ok := flagHeader(r.Header.Get(HeaderAgentFinal)); {
	case on:
		p.AgentFinal = a.Agent != ""
	case !ok:
		n.m.Decision(admit.LayerValidation, admit.Refuse, openai.CodeInvalidParameter)
		return refuse(openai.NewError(http.StatusBadRequest, openai.CodeInvalidParameter,
			HeaderAgentFinal+" must be 1, true, 0 or false").WithParam(HeaderAgentFinal), 0)
	}
	if d := n.adm.Validate(*a); d.Refused() {
		n.m.DecisionOf(d)
		return refuse(journey.ClientRefusal(p, d), 0)
	}
	tenant, d := n.adm.Identify(start, *a)
	if d.Refused() {
		n.m.DecisionOf(d)
		return refuse(journey.RefusalOf(d), d.RetryAfter)
	}
	a.Tenant, a.Priority = tenant, d.Priority
	if a.Agent != "" {
		a.Agent = agent.Scoped(tenant, a.Agent) // the owner takes it as sent, already scoped
	}
	p.Req.Priority = a.Priority
	if d.PriorityClamped {
		w.Header().Set(HeaderPriorityGranted, strconv.Itoa(d.Priority))
	}
	a.APIKey = "" // identified; the raw key goes no further
	// Any other value asks no explanation: it changes nothing the request gets.
	explain, _ := flagHeader(r.Header.Get(HeaderExplain))
	if n.cfg.Standalone {
		// kvmesh engine is an engine, not a mesh: like vLLM it queues whatever can ever run and
		// refuses only what cannot (context, KV budget).
		d := n.adm.Admit(start, *a, []admit.Option{n.planner.LocalOption(*a, n.selfPeer(p.Req.Blocks), n.blockTokens())})
		n.m.DecisionOf(d)
		if d.Refused() && d.Status == http.StatusBadRequest {
			return refuse(journey.ClientRefusal(p, d), 0)
		}
		p.Req.MaxTokens = d.MaxTokens
		return n.serveEngine(ctx, w, r, p, start)
	}
	if o, done := n.x.Delegate(ctx, w, p, start, explain); done {
		return o
	}
	return n.x.AdmitAndDispatch(ctx, w, p, start, explain)
}
