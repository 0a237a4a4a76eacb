package node

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/agent"
	"github.com/kvmesh/kvmesh/admit/plan"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/node/attempt"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/journey"
	"github.com/kvmesh/kvmesh/node/meshview"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/relay"
)

// Request headers.
const (
	HeaderPriority = "X-Kvmesh-Priority"
	HeaderQueueTTL = "X-Kvmesh-Queue-TTL"
	HeaderTTFTSLO  = "X-Kvmesh-TTFT-SLO"
	HeaderTPOTSLO  = "X-Kvmesh-TPOT-SLO"
	HeaderAgent    = "X-Kvmesh-Agent"
	HeaderExplain  = "X-Kvmesh-Explain"
)

// HeaderPriorityGranted, on a response, is the priority the request ran at when its key (or
// the mesh's cap) allowed less than X-Kvmesh-Priority asked for.
const HeaderPriorityGranted = "X-Kvmesh-Priority-Granted"

// HeaderTTFTTarget and HeaderTPOTTarget, on an admitted request's response, are the targets the
// mesh held it to: the client's own, or its class default with the TTFT one fitted to its size.
const (
	HeaderTTFTTarget = "X-Kvmesh-TTFT-Target"
	HeaderTPOTTarget = "X-Kvmesh-TPOT-Target"
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

// refusalOf turns an admission decision into the client's error.
func refusalOf(d admit.Decision) *openai.Error {
	e := openai.NewError(d.Status, d.Code, d.Message)
	if d.Param != "" {
		e = e.WithParam(d.Param)
	}
	return e
}

// clientRefusal is refusalOf(d) in the terms of p's body. Admission calls the output cap
// max_tokens and the count of top log probabilities logprobs, whichever field set them
// (max_completion_tokens, chat's top_logprobs); and a prompt that leaves no room for output is
// the prompt's fault, not that of a max_tokens the client may never have sent.
func clientRefusal(p *journey.Request, d admit.Decision) *openai.Error {
	e := refusalOf(d)
	capField := cmp.Or(p.CapField, "max_tokens")
	rename := func(from, to string) {
		if e.Param == from {
			e.Param, e.Message = to, strings.Replace(e.Message, from, to, 1)
		}
	}
	switch {
	case d.Code == admit.CodeContextLengthExceeded && p.Adm.MaxTokens == nil:
		e.Param = promptField(p.Endpoint)
		e.Message = fmt.Sprintf("this model's context is %d tokens and the prompt has %d: no room is left for output",
			p.Model.ContextTokens, p.Adm.PromptTokens)
	case d.Code == admit.CodeContextLengthExceeded && p.Adm.PromptTokens >= p.Model.ContextTokens:
		rename("max_tokens", capField)
		e.Param = promptField(p.Endpoint)
	case p.Endpoint == engine.Chat && d.Param == "logprobs":
		rename("logprobs", "top_logprobs")
	default:
		rename("max_tokens", capField)
	}
	return e
}

// promptField is the body member that holds ep's prompt.
func promptField(ep engine.Endpoint) string {
	if ep == engine.Completion {
		return "prompt"
	}
	return "messages"
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
		return refuse(clientRefusal(p, d), 0)
	}
	tenant, d := n.adm.Identify(start, *a)
	if d.Refused() {
		n.m.DecisionOf(d)
		return refuse(refusalOf(d), d.RetryAfter)
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
			return refuse(clientRefusal(p, d), 0)
		}
		p.Req.MaxTokens = d.MaxTokens
		return n.serveEngine(ctx, w, r, p, start)
	}
	if o, done := n.delegate(ctx, w, p, start, explain); done {
		return o
	}
	return n.admitAndDispatch(ctx, w, p, start, explain)
}

// admitAndDispatch decides, waits in the waiting room while admission says queue, and runs the
// request on the chosen candidate or the next ones. When the candidates' owners refuse before
// the first byte, the request goes back to the waiting room (keeping its arrival time, so its
// TTL still bounds the whole wait), not to the client; when their attempts fail instead (an
// owner unreachable, its engine failing), the request ends with a 502 (see failures).
func (n *Node) admitAndDispatch(ctx context.Context, w http.ResponseWriter, p *journey.Request, start time.Time, explain bool) journey.Outcome {
	// A step an agent window still holds when this returns ended without running.
	defer n.giveUpAgent(p)
	n.retries.Request(start)
	// Its first token is due within its queue TTL of its arrival (a continuation's: of its
	// migration), wherever it waits.
	if p.Due.IsZero() { // set: a rerun after its delegate failed (delegate.go), renewed
		p.TTL = n.adm.TTL(p.Adm)
		p.Due = start.Add(p.TTL)
	}
	t := &journey.Ticket{}
	var f attempt.Failures
	n.decide(start, p, t, nil, nil)
	n.m.DecisionOf(t.D)
	n.m.ClassDecisions.WithLabelValues(admit.Class(p.Adm.Priority), t.D.Action.String()).Inc()
	for {
		if t.D.Action == admit.Queue {
			if res := n.wait(ctx, p, t); res.gone {
				return journey.Outcome{Code: openai.CodeClientClosed, Refused: true}
			}
		}
		traceDecision(ctx, p, t)
		n.explained(p, t)
		if explain && len(t.Cands) > 0 {
			w.Header().Set(HeaderExplain, route.Explain(t.Cands, 3))
		}
		if t.D.Refused() {
			e := clientRefusal(p, t.D)
			if explain && len(t.Cands) > 0 {
				e.Message += " (candidates: " + route.Explain(t.Cands, 3) + ")"
			}
			journey.WriteRefusal(w, e, t.D.RetryAfter)
			return journey.Outcome{Code: e.Code, Refused: true}
		}
		p.Req.MaxTokens = t.D.MaxTokens
		ttft, tpot := n.adm.SLOFor(p.Adm)
		w.Header().Set(HeaderTTFTTarget, ttft.Round(time.Millisecond).String())
		w.Header().Set(HeaderTPOTTarget, tpot.Round(time.Millisecond).String())
		res := n.dispatch(ctx, w, p, t, start, &f)
		if !res.Requeue {
			n.kickRoom()
			return res.Outcome
		}
		if res.LastCode == CodeAgentPaused && n.agents != nil {
			if o, done := n.awaitAgent(ctx, w, p, t); done {
				return o
			}
			continue
		}
		// Every owner said no: wait for room like any queued request.
		t.D = admit.Decision{Action: admit.Queue, Layer: admit.LayerQueue, Code: admit.CodeWaitKV, Option: -1,
			Tenant: p.Adm.Tenant, MaxTokens: t.D.MaxTokens, ExpectedTokens: t.D.ExpectedTokens, PrefillTokens: t.D.PrefillTokens}
	}
}

// decide runs the planner for p: a new request when it is nil, else the queued item it; hold
// is the room the blocked head of its pool waits for (nil: none). It never blocks.
func (n *Node) decide(now time.Time, p *journey.Request, t *journey.Ticket, it *admit.Item, claim *admit.Claim) {
	n.buildView(&t.View, p.Adm.Model, p.Adm.Parent, p.Req.Blocks, p.Adm.Agent, meshview.Rank{Priority: p.Adm.Priority, Arrived: p.Adm.Arrived})
	t.View.Exclude(p.Exclude)
	if it == nil {
		n.planner.Ingress(now, p.Adm, &t.View.View, &t.Plan)
	} else {
		n.planner.Queued(now, it, claim, &t.View.View, &t.Plan)
	}
	if p.Adm.OwnTTFT == 0 {
		p.Adm.OwnTTFT = t.D.OwnTTFT // the request's default TTFT target, fitted once to its size
	}
	if t.CarbonRouted {
		n.m.CarbonRouted.Inc()
	}
	if t.D.Action == admit.Accept && t.D.Option >= 0 && t.D.Option < len(t.Cands) && !p.AdapterRouted {
		// Once a request, at its first accept: one its owners refuse comes back to the
		// waiting room and is accepted again.
		if r := t.Cands[t.D.Option].Terms.Residency; r != route.ResidencyNone {
			n.m.AdapterRouted.WithLabelValues(r.String()).Inc()
			p.AdapterRouted = true
		}
	}
	if t.D.Code == CodeCarbonDeferred {
		n.m.CarbonDeferred.Inc()
	}
}

// dispatch runs p on the candidates of t from the decision's choice on, as the attempt
// planner (attempt.Whole) says: this node's engine, a peer over QUIC, or a pair. Nothing
// reaches the client until some owner accepted. Failures, counted in f across dispatches,
// end the request (endFailed); refusals send it back to the waiting room.
func (n *Node) dispatch(ctx context.Context, w http.ResponseWriter, p *journey.Request, t *journey.Ticket, start time.Time, f *attempt.Failures) journey.Result {
	res := journey.Result{Requeue: true, LastCode: admit.CodeNoCapacity}
	// The planner sees the candidates it may try: from the decision's choice (first), at most
	// ForwardAttempts of them; its index i is t.Cands[first+i].
	first := t.D.Option
	var buf [8]attempt.Cand
	cands := buf[:0]
	for i := first; i < len(t.Cands) && i-first < n.cfg.ForwardAttempts; i++ {
		cands = append(cands, candOf(&t.View, &t.Cands[i]))
	}
	d := attempt.Whole{Cands: cands, Attempts: n.cfg.ForwardAttempts, F: f}
	for s := d.Start(); ; s = d.Next(n.runAttempt(ctx, w, p, t, first+s.Cand, s, start, &res)) {
		switch s.Kind {
		case attempt.Answered:
			if s.Stick {
				n.stick(p, cands[s.Cand].Name)
			}
			p.Parked = journey.Parking{} // answered (it ran): no window keeps it parked any more
			return journey.Result{Outcome: res.Outcome}
		case attempt.Requeue:
			return res
		case attempt.Fail:
			n.planner.Release(&t.Plan) // the decision's reservation, when its retry was refused
			return n.x.EndFailed(w, f)
		case attempt.Gone:
			return journey.Result{Outcome: journey.Outcome{Code: openai.CodeClientClosed, Refused: true}}
		case attempt.Migrate:
			cause := fmt.Errorf("%w: %s", errEngineFailed, res.Broke.Message)
			return journey.Result{Outcome: n.migrate(ctx, res.CS, p, n.cfg.Name, cause)}
		}
	}
}

// candOf is c as the attempt planner sees it.
func candOf(v *meshview.View, c *route.Candidate) attempt.Cand {
	return attempt.Cand{Name: c.Name, Peer: c.Peer, Self: v.Peers[c.Peer].Self, Pair: c.Pair != nil}
}

// runAttempt performs the attempt s of a dispatch (RunLocal, Forward or RunPair) on candidate
// i of t and reports how it ended; an answer's outcome is left in res.o.
func (n *Node) runAttempt(ctx context.Context, w http.ResponseWriter, p *journey.Request, t *journey.Ticket, i int, s attempt.Step, start time.Time, res *journey.Result) attempt.Result {
	c := &t.Cands[i]
	if s.Rerun {
		n.renewDue(p)
	}
	if s.Budget && !n.x.AllowRetry(p, c.Name) {
		return attempt.Result{Outcome: attempt.BudgetSpent}
	}
	if s.Reserve {
		n.planner.Reserve(time.Now(), p.Adm, &t.Plan, i)
	}
	if t.SplitWhy != "" {
		// Each candidate tried counts, as what it is: admission's choice, then fallbacks.
		n.m.Disagg.WithLabelValues(dispatchOutcome(&t.Plan, i)).Inc()
	}
	defer n.planner.Release(&t.Plan)
	switch s.Kind {
	case attempt.RunPair:
		var r attempt.Result
		res.Outcome, r = n.dispatchPair(ctx, w, p, t, c, start, res)
		return r
	case attempt.RunLocal:
		n.m.Forwards.WithLabelValues("local").Inc()
		return n.runLocal(ctx, w, p, c.Name, start, res)
	}
	addr := t.View.QUIC[c.Peer]
	o, done := n.forward(ctx, w, p, c.Name, addr, start, res)
	return n.afterForward(ctx, p, c.Name, addr, o, done, res)
}

// runLocal performs a RunLocal attempt: p on this node's engine, named name. The engine's
// failure is the planner's to hear, not the client's: before anything reached the client, the
// attempt failed (the next candidate runs the request); after a stream began, it broke, the
// client's stream kept in res.cs for the migration.
func (n *Node) runLocal(ctx context.Context, w http.ResponseWriter, p *journey.Request, name string, start time.Time, res *journey.Result) attempt.Result {
	w = n.clientStream(w, p, res)
	p.MoveBreak = true
	o, ran := n.agentStep(ctx, w, p, start, "local")
	p.MoveBreak = false
	if !ran {
		res.LastCode = CodeAgentPaused
		n.agentRefused(p, name, "", res)
		return attempt.Result{Outcome: attempt.Paused}
	}
	return n.localResult(p, name, o, res)
}

// localResult is how a run of p on this node's engine (named name) that ended with o went, for
// the planner: answered, broke mid-response (res.broke), refused (the engine's 429), or failed
// before the client's first byte.
func (n *Node) localResult(p *journey.Request, name string, o journey.Outcome, res *journey.Result) attempt.Result {
	switch {
	case o.Broke == nil:
		res.Outcome = o
		return attempt.Result{Outcome: attempt.Ran}
	case o.Begun:
		res.Broke = o.Broke
		return attempt.Result{Outcome: attempt.Broke}
	case o.Broke.Status == http.StatusTooManyRequests:
		// This node's engine is overloaded by its own account: this node refused, as an owner
		// whose engine answers a forward with 429 does.
		n.x.EngineBusy(p, name, o.Code, res)
		return attempt.Result{Outcome: attempt.Refused, Reason: res.LastCode, Now: time.Now()}
	}
	n.log.Warn("engine failed before the request's first byte; the next candidate runs it", "id", p.Req.ID,
		"code", o.Code, "err", o.Broke.Message)
	res.LastCode, res.FailCode = o.Code, o.Code
	return attempt.Result{Outcome: attempt.Failed, Code: o.Code, Reason: o.Code, Now: time.Now()}
}

// clientStream is the writer a local run of p answers on: for a stream, the client's stream
// (a continuation's goes on in the client's), kept in res.cs for a migration should the
// engine break mid-response.
func (n *Node) clientStream(w http.ResponseWriter, p *journey.Request, res *journey.Result) http.ResponseWriter {
	if !p.Stream {
		return w
	}
	cs, ok := w.(*relay.Stream)
	if !ok {
		cs = relay.New(w, p.Endpoint == engine.Chat, n.cfg.Migrations >= 0)
	}
	res.CS = cs
	return cs
}

// afterForward is the result of a forward to owner at addr that answered the client (done, with
// o) or not (res says why).
func (n *Node) afterForward(ctx context.Context, p *journey.Request, owner, addr string, o journey.Outcome, done bool, res *journey.Result) attempt.Result {
	switch {
	case done:
		// An owner whose queue starved the request is no home.
		res.Outcome = o
		return attempt.Result{Outcome: attempt.Ran, Late: o.Code == openai.CodeEngineTimeout}
	case n.agentRefused(p, owner, addr, res):
		return attempt.Result{Outcome: attempt.Paused, Code: res.FailCode}
	case ctx.Err() != nil:
		return attempt.Result{Outcome: attempt.ClientGone}
	case res.FailCode != "":
		return attempt.Result{Outcome: attempt.Failed, Code: res.FailCode, Reason: res.LastCode, Now: time.Now()}
	}
	return attempt.Result{Outcome: attempt.Refused, Reason: res.LastCode, Now: time.Now()}
}

func (n *Node) stick(p *journey.Request, peer string) {
	if p.Adm.Agent != "" {
		n.planner.Policy().Stick(p.Adm.Agent, peer)
	}
}
