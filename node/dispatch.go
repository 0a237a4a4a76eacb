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
func clientRefusal(p *prepared, d admit.Decision) *openai.Error {
	e := refusalOf(d)
	capField := cmp.Or(p.capField, "max_tokens")
	rename := func(from, to string) {
		if e.Param == from {
			e.Param, e.Message = to, strings.Replace(e.Message, from, to, 1)
		}
	}
	switch {
	case d.Code == admit.CodeContextLengthExceeded && p.adm.MaxTokens == nil:
		e.Param = promptField(p.endpoint)
		e.Message = fmt.Sprintf("this model's context is %d tokens and the prompt has %d: no room is left for output",
			p.model.ContextTokens, p.adm.PromptTokens)
	case d.Code == admit.CodeContextLengthExceeded && p.adm.PromptTokens >= p.model.ContextTokens:
		rename("max_tokens", capField)
		e.Param = promptField(p.endpoint)
	case p.endpoint == engine.Chat && d.Param == "logprobs":
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
func (n *Node) ingest(ctx context.Context, w http.ResponseWriter, r *http.Request, ep engine.Endpoint, id string, start time.Time) outcome {
	if o, ok := n.authenticate(w, r); !ok {
		return o
	}
	// The body must be JSON whatever Content-Type says: curl -d sends form encoding by default.
	body, oerr := n.readBody(r)
	if oerr != nil {
		n.m.decision(admit.LayerValidation, admit.Refuse, oerr.Code)
		return refuseSimple(w, oerr, 0)
	}
	return n.ingestBody(ctx, w, r, ep, id, start, body)
}

// ingestBody is ingest once the request's body is read (for the Messages API, translated).
func (n *Node) ingestBody(ctx context.Context, w http.ResponseWriter, r *http.Request, ep engine.Endpoint, id string, start time.Time, body []byte) outcome {
	refuse := func(e *openai.Error, retry time.Duration) outcome {
		writeRefusal(w, e, retry)
		return outcome{code: e.Code, refused: true}
	}
	p, oerr := n.prepare(ep, id, body)
	if oerr == nil {
		p.native = nativeOf(w)
		oerr = n.clientKVTransfer(p.req.Extra)
	}
	if oerr == nil {
		oerr = parseHeaders(r.Header, &p.adm, n.cfg.MaxAgentIDBytes)
	}
	if oerr != nil {
		n.m.decision(admit.LayerValidation, admit.Refuse, oerr.Code)
		return refuse(oerr, 0)
	}
	if ic, ok := w.(inputCounter); ok {
		ic.SetInputTokens(p.adm.PromptTokens)
	}
	a := &p.adm
	a.Arrived, a.APIKey = start, bearer(r.Header)
	if a.Agent == "" && n.cfg.AgentFromUser {
		a.Agent = p.user
	}
	switch on, ok := flagHeader(r.Header.Get(HeaderAgentFinal)); {
	case on:
		p.agentFinal = a.Agent != ""
	case !ok:
		n.m.decision(admit.LayerValidation, admit.Refuse, openai.CodeInvalidParameter)
		return refuse(openai.NewError(http.StatusBadRequest, openai.CodeInvalidParameter,
			HeaderAgentFinal+" must be 1, true, 0 or false").WithParam(HeaderAgentFinal), 0)
	}
	if d := n.adm.Validate(*a); d.Refused() {
		n.m.decisionOf(d)
		return refuse(clientRefusal(p, d), 0)
	}
	tenant, d := n.adm.Identify(start, *a)
	if d.Refused() {
		n.m.decisionOf(d)
		return refuse(refusalOf(d), d.RetryAfter)
	}
	a.Tenant, a.Priority = tenant, d.Priority
	if a.Agent != "" {
		a.Agent = agent.Scoped(tenant, a.Agent) // the owner takes it as sent, already scoped
	}
	p.req.Priority = a.Priority
	if d.PriorityClamped {
		w.Header().Set(HeaderPriorityGranted, strconv.Itoa(d.Priority))
	}
	a.APIKey = "" // identified; the raw key goes no further
	// Any other value asks no explanation: it changes nothing the request gets.
	explain, _ := flagHeader(r.Header.Get(HeaderExplain))
	if n.cfg.Standalone {
		// kvmesh engine is an engine, not a mesh: like vLLM it queues whatever can ever run and
		// refuses only what cannot (context, KV budget).
		d := n.adm.Admit(start, *a, []admit.Option{n.planner.LocalOption(*a, n.selfPeer(p.req.Blocks), n.blockTokens())})
		n.m.decisionOf(d)
		if d.Refused() && d.Status == http.StatusBadRequest {
			return refuse(clientRefusal(p, d), 0)
		}
		p.req.MaxTokens = d.MaxTokens
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
func (n *Node) admitAndDispatch(ctx context.Context, w http.ResponseWriter, p *prepared, start time.Time, explain bool) outcome {
	// A step an agent window still holds when this returns ended without running.
	defer n.giveUpAgent(p)
	n.retries.Request(start)
	// Its first token is due within its queue TTL of its arrival (a continuation's: of its
	// migration), wherever it waits.
	if p.due.IsZero() { // set: a rerun after its delegate failed (delegate.go), renewed
		p.ttl = n.adm.TTL(p.adm)
		p.due = start.Add(p.ttl)
	}
	t := &ticket{}
	var f attempt.Failures
	n.decide(start, p, t, nil, nil)
	n.m.decisionOf(t.D)
	n.m.classDecisions.WithLabelValues(admit.Class(p.adm.Priority), t.D.Action.String()).Inc()
	for {
		if t.D.Action == admit.Queue {
			if res := n.wait(ctx, p, t); res.gone {
				return outcome{code: openai.CodeClientClosed, refused: true}
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
			writeRefusal(w, e, t.D.RetryAfter)
			return outcome{code: e.Code, refused: true}
		}
		p.req.MaxTokens = t.D.MaxTokens
		ttft, tpot := n.adm.SLOFor(p.adm)
		w.Header().Set(HeaderTTFTTarget, ttft.Round(time.Millisecond).String())
		w.Header().Set(HeaderTPOTTarget, tpot.Round(time.Millisecond).String())
		res := n.dispatch(ctx, w, p, t, start, &f)
		if !res.requeue {
			n.kickRoom()
			return res.o
		}
		if res.lastCode == CodeAgentPaused && n.agents != nil {
			if o, done := n.awaitAgent(ctx, w, p, t); done {
				return o
			}
			continue
		}
		// Every owner said no: wait for room like any queued request.
		t.D = admit.Decision{Action: admit.Queue, Layer: admit.LayerQueue, Code: admit.CodeWaitKV, Option: -1,
			Tenant: p.adm.Tenant, MaxTokens: t.D.MaxTokens, ExpectedTokens: t.D.ExpectedTokens, PrefillTokens: t.D.PrefillTokens}
	}
}

// decide runs the planner for p: a new request when it is nil, else the queued item it; hold
// is the room the blocked head of its pool waits for (nil: none). It never blocks.
func (n *Node) decide(now time.Time, p *prepared, t *ticket, it *admit.Item, claim *admit.Claim) {
	n.buildView(&t.v, p.adm.Model, p.adm.Parent, p.req.Blocks, p.adm.Agent, rank{p.adm.Priority, p.adm.Arrived})
	t.v.exclude(p.exclude)
	if it == nil {
		n.planner.Ingress(now, p.adm, &t.v.View, &t.Plan)
	} else {
		n.planner.Queued(now, it, claim, &t.v.View, &t.Plan)
	}
	if p.adm.OwnTTFT == 0 {
		p.adm.OwnTTFT = t.D.OwnTTFT // the request's default TTFT target, fitted once to its size
	}
	if t.CarbonRouted {
		n.m.carbonRouted.Inc()
	}
	if t.D.Action == admit.Accept && t.D.Option >= 0 && t.D.Option < len(t.Cands) && !p.adapterRouted {
		// Once a request, at its first accept: one its owners refuse comes back to the
		// waiting room and is accepted again.
		if r := t.Cands[t.D.Option].Terms.Residency; r != route.ResidencyNone {
			n.m.adapterRouted.WithLabelValues(r.String()).Inc()
			p.adapterRouted = true
		}
	}
	if t.D.Code == CodeCarbonDeferred {
		n.m.carbonDeferred.Inc()
	}
}

// dispatchResult is how a dispatch ended: an outcome written to the client, or (requeue) the
// candidates refused before the first byte and nothing was written. While the dispatch runs
// it is the executor's scratch: the last attempt's codes and the answer's outcome.
type dispatchResult struct {
	o        outcome
	requeue  bool
	lastCode string
	// failCode is set by forward when its attempt failed rather than was refused: the owner
	// unreachable (CodeOwnerUnreachable) or its engine's failure code.
	failCode string
	// broke is the failure of this node's engine mid-response (attempt.Broke), and cs the
	// client's stream it broke.
	broke *openai.Error
	cs    *relay.Stream
}

// dispatch runs p on the candidates of t from the decision's choice on, as the attempt
// planner (attempt.Whole) says: this node's engine, a peer over QUIC, or a pair. Nothing
// reaches the client until some owner accepted. Failures, counted in f across dispatches,
// end the request (endFailed); refusals send it back to the waiting room.
func (n *Node) dispatch(ctx context.Context, w http.ResponseWriter, p *prepared, t *ticket, start time.Time, f *attempt.Failures) dispatchResult {
	res := dispatchResult{requeue: true, lastCode: admit.CodeNoCapacity}
	// The planner sees the candidates it may try: from the decision's choice (first), at most
	// ForwardAttempts of them; its index i is t.Cands[first+i].
	first := t.D.Option
	var buf [8]attempt.Cand
	cands := buf[:0]
	for i := first; i < len(t.Cands) && i-first < n.cfg.ForwardAttempts; i++ {
		cands = append(cands, candOf(&t.v, &t.Cands[i]))
	}
	d := attempt.Whole{Cands: cands, Attempts: n.cfg.ForwardAttempts, F: f}
	for s := d.Start(); ; s = d.Next(n.runAttempt(ctx, w, p, t, first+s.Cand, s, start, &res)) {
		switch s.Kind {
		case attempt.Answered:
			if s.Stick {
				n.stick(p, cands[s.Cand].Name)
			}
			p.parked = parking{} // answered (it ran): no window keeps it parked any more
			return dispatchResult{o: res.o}
		case attempt.Requeue:
			return res
		case attempt.Fail:
			n.planner.Release(&t.Plan) // the decision's reservation, when its retry was refused
			return n.endFailed(w, f)
		case attempt.Gone:
			return dispatchResult{o: outcome{code: openai.CodeClientClosed, refused: true}}
		case attempt.Migrate:
			cause := fmt.Errorf("%w: %s", errEngineFailed, res.broke.Message)
			return dispatchResult{o: n.migrate(ctx, res.cs, p, n.cfg.Name, cause)}
		}
	}
}

// candOf is c as the attempt planner sees it.
func candOf(v *view, c *route.Candidate) attempt.Cand {
	return attempt.Cand{Name: c.Name, Peer: c.Peer, Self: v.Peers[c.Peer].Self, Pair: c.Pair != nil}
}

// runAttempt performs the attempt s of a dispatch (RunLocal, Forward or RunPair) on candidate
// i of t and reports how it ended; an answer's outcome is left in res.o.
func (n *Node) runAttempt(ctx context.Context, w http.ResponseWriter, p *prepared, t *ticket, i int, s attempt.Step, start time.Time, res *dispatchResult) attempt.Result {
	c := &t.Cands[i]
	if s.Rerun {
		n.renewDue(p)
	}
	if s.Budget && !n.allowRetry(p, c.Name) {
		return attempt.Result{Outcome: attempt.BudgetSpent}
	}
	if s.Reserve {
		n.planner.Reserve(time.Now(), p.adm, &t.Plan, i)
	}
	if t.SplitWhy != "" {
		// Each candidate tried counts, as what it is: admission's choice, then fallbacks.
		n.m.disagg.WithLabelValues(dispatchOutcome(&t.Plan, i)).Inc()
	}
	defer n.planner.Release(&t.Plan)
	switch s.Kind {
	case attempt.RunPair:
		var r attempt.Result
		res.o, r = n.dispatchPair(ctx, w, p, t, c, start, res)
		return r
	case attempt.RunLocal:
		n.m.forwards.WithLabelValues("local").Inc()
		return n.runLocal(ctx, w, p, c.Name, start, res)
	}
	addr := t.v.quic[c.Peer]
	o, done := n.forward(ctx, w, p, c.Name, addr, start, res)
	return n.afterForward(ctx, p, c.Name, addr, o, done, res)
}

// runLocal performs a RunLocal attempt: p on this node's engine, named name. The engine's
// failure is the planner's to hear, not the client's: before anything reached the client, the
// attempt failed (the next candidate runs the request); after a stream began, it broke, the
// client's stream kept in res.cs for the migration.
func (n *Node) runLocal(ctx context.Context, w http.ResponseWriter, p *prepared, name string, start time.Time, res *dispatchResult) attempt.Result {
	w = n.clientStream(w, p, res)
	p.moveBreak = true
	o, ran := n.agentStep(ctx, w, p, start, "local")
	p.moveBreak = false
	if !ran {
		res.lastCode = CodeAgentPaused
		n.agentRefused(p, name, "", res)
		return attempt.Result{Outcome: attempt.Paused}
	}
	return n.localResult(p, name, o, res)
}

// localResult is how a run of p on this node's engine (named name) that ended with o went, for
// the planner: answered, broke mid-response (res.broke), refused (the engine's 429), or failed
// before the client's first byte.
func (n *Node) localResult(p *prepared, name string, o outcome, res *dispatchResult) attempt.Result {
	switch {
	case o.broke == nil:
		res.o = o
		return attempt.Result{Outcome: attempt.Ran}
	case o.begun:
		res.broke = o.broke
		return attempt.Result{Outcome: attempt.Broke}
	case o.broke.Status == http.StatusTooManyRequests:
		// This node's engine is overloaded by its own account: this node refused, as an owner
		// whose engine answers a forward with 429 does.
		n.engineBusy(p, name, o.code, res)
		return attempt.Result{Outcome: attempt.Refused, Reason: res.lastCode, Now: time.Now()}
	}
	n.log.Warn("engine failed before the request's first byte; the next candidate runs it", "id", p.req.ID,
		"code", o.code, "err", o.broke.Message)
	res.lastCode, res.failCode = o.code, o.code
	return attempt.Result{Outcome: attempt.Failed, Code: o.code, Reason: o.code, Now: time.Now()}
}

// clientStream is the writer a local run of p answers on: for a stream, the client's stream
// (a continuation's goes on in the client's), kept in res.cs for a migration should the
// engine break mid-response.
func (n *Node) clientStream(w http.ResponseWriter, p *prepared, res *dispatchResult) http.ResponseWriter {
	if !p.stream {
		return w
	}
	cs, ok := w.(*relay.Stream)
	if !ok {
		cs = relay.New(w, p.endpoint == engine.Chat, n.cfg.Migrations >= 0)
	}
	res.cs = cs
	return cs
}

// afterForward is the result of a forward to owner at addr that answered the client (done, with
// o) or not (res says why).
func (n *Node) afterForward(ctx context.Context, p *prepared, owner, addr string, o outcome, done bool, res *dispatchResult) attempt.Result {
	switch {
	case done:
		// An owner whose queue starved the request is no home.
		res.o = o
		return attempt.Result{Outcome: attempt.Ran, Late: o.code == openai.CodeEngineTimeout}
	case n.agentRefused(p, owner, addr, res):
		return attempt.Result{Outcome: attempt.Paused, Code: res.failCode}
	case ctx.Err() != nil:
		return attempt.Result{Outcome: attempt.ClientGone}
	case res.failCode != "":
		return attempt.Result{Outcome: attempt.Failed, Code: res.failCode, Reason: res.lastCode, Now: time.Now()}
	}
	return attempt.Result{Outcome: attempt.Refused, Reason: res.lastCode, Now: time.Now()}
}

func (n *Node) stick(p *prepared, peer string) {
	if p.adm.Agent != "" {
		n.planner.Policy().Stick(p.adm.Agent, peer)
	}
}
