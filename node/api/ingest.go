package api

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/agent"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/journey"
	"github.com/kvmesh/kvmesh/node/openai"
)

// ParseHeaders fills the admission fields that come from X-Kvmesh-* headers.
func ParseHeaders(h http.Header, a *admit.Request, maxAgent int) *openai.Error {
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

// FlagHeader reads a boolean X-Kvmesh-* header: on for 1 or true, off for none, 0 or false
// (case aside, as HTTP clients and proxies vary), ok false for anything else.
func FlagHeader(v string) (on, ok bool) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true":
		return true, true
	case "", "0", "false":
		return false, true
	}
	return false, false
}

// ingest runs one client request through the pipeline of docs/design/admission.md:
// Authenticate, decode, validate, identity (the key's bucket), budget, route, admit, wait,
// dispatch.
func (sv *Server) ingest(ctx context.Context, w http.ResponseWriter, r *http.Request, ep engine.Endpoint, id string, start time.Time) journey.Outcome {
	if o, ok := sv.Authenticate(w, r); !ok {
		return o
	}
	// The body must be JSON whatever Content-Type says: curl -d sends form encoding by default.
	body, oerr := sv.ReadBody(r)
	if oerr != nil {
		sv.m.Decision(admit.LayerValidation, admit.Refuse, oerr.Code)
		return RefuseSimple(w, oerr, 0)
	}
	return sv.IngestBody(ctx, w, r, ep, id, start, body)
}

// IngestBody is ingest once the request's body is read (for the Messages API, translated).
func (sv *Server) IngestBody(ctx context.Context, w http.ResponseWriter, r *http.Request, ep engine.Endpoint, id string, start time.Time, body []byte) journey.Outcome {
	refuse := func(e *openai.Error, retry time.Duration) journey.Outcome {
		journey.WriteRefusal(w, e, retry)
		return journey.Outcome{Code: e.Code, Refused: true}
	}
	p, oerr := sv.Prepare(ep, id, body)
	if oerr == nil {
		p.Native = nativeOf(w)
		oerr = sv.ClientKVTransfer(p.Req.Extra)
	}
	if oerr == nil {
		oerr = ParseHeaders(r.Header, &p.Adm, sv.cfg.MaxAgentIDBytes)
	}
	if oerr != nil {
		sv.m.Decision(admit.LayerValidation, admit.Refuse, oerr.Code)
		return refuse(oerr, 0)
	}
	if ic, ok := w.(inputCounter); ok {
		ic.SetInputTokens(p.Adm.PromptTokens)
	}
	a := &p.Adm
	a.Arrived, a.APIKey = start, Bearer(r.Header)
	if a.Agent == "" && sv.cfg.AgentFromUser {
		a.Agent = p.User
	}
	switch on, ok := FlagHeader(r.Header.Get(HeaderAgentFinal)); {
	case on:
		p.AgentFinal = a.Agent != ""
	case !ok:
		sv.m.Decision(admit.LayerValidation, admit.Refuse, openai.CodeInvalidParameter)
		return refuse(openai.NewError(http.StatusBadRequest, openai.CodeInvalidParameter,
			HeaderAgentFinal+" must be 1, true, 0 or false").WithParam(HeaderAgentFinal), 0)
	}
	if d := sv.adm.Validate(*a); d.Refused() {
		sv.m.DecisionOf(d)
		return refuse(journey.ClientRefusal(p, d), 0)
	}
	tenant, d := sv.adm.Identify(start, *a)
	if d.Refused() {
		sv.m.DecisionOf(d)
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
	explain, _ := FlagHeader(r.Header.Get(journey.HeaderExplain))
	if sv.cfg.Standalone {
		// kvmesh engine is an engine, not a mesh: like vLLM it queues whatever can ever run and
		// refuses only what cannot (context, KV budget).
		d := sv.adm.Admit(start, *a, []admit.Option{sv.planner.LocalOption(*a, sv.host.SelfPeer(p.Req.Blocks), journey.BlockTokens(sv.eng))})
		sv.m.DecisionOf(d)
		if d.Refused() && d.Status == http.StatusBadRequest {
			return refuse(journey.ClientRefusal(p, d), 0)
		}
		p.Req.MaxTokens = d.MaxTokens
		return sv.serveEngine(ctx, w, r, p, start)
	}
	if o, done := sv.x.Delegate(ctx, w, p, start, explain); done {
		return o
	}
	return sv.x.AdmitAndDispatch(ctx, w, p, start, explain)
}
