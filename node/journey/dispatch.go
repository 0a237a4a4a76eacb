package journey

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/plan"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/node/attempt"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/meshview"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/relay"
)

// RefusalOf turns an admission decision into the client's error.
func RefusalOf(d admit.Decision) *openai.Error {
	e := openai.NewError(d.Status, d.Code, d.Message)
	if d.Param != "" {
		e = e.WithParam(d.Param)
	}
	return e
}

// ClientRefusal is RefusalOf(d) in the terms of p's body. Admission calls the output cap
// max_tokens and the count of top log probabilities logprobs, whichever field set them
// (max_completion_tokens, chat's top_logprobs); and a prompt that leaves no room for output is
// the prompt's fault, not that of a max_tokens the client may never have sent.
func ClientRefusal(p *Request, d admit.Decision) *openai.Error {
	e := RefusalOf(d)
	capField := cmp.Or(p.CapField, "max_tokens")
	rename := func(from, to string) {
		if e.Param == from {
			e.Param, e.Message = to, strings.Replace(e.Message, from, to, 1)
		}
	}
	switch {
	case d.Code == admit.CodeContextLengthExceeded && p.Adm.MaxTokens == nil:
		e.Param = PromptField(p.Endpoint)
		e.Message = fmt.Sprintf("this model's context is %d tokens and the prompt has %d: no room is left for output",
			p.Model.ContextTokens, p.Adm.PromptTokens)
	case d.Code == admit.CodeContextLengthExceeded && p.Adm.PromptTokens >= p.Model.ContextTokens:
		rename("max_tokens", capField)
		e.Param = PromptField(p.Endpoint)
	case p.Endpoint == engine.Chat && d.Param == "logprobs":
		rename("logprobs", "top_logprobs")
	default:
		rename("max_tokens", capField)
	}
	return e
}

// PromptField is the body member that holds ep's prompt.
func PromptField(ep engine.Endpoint) string {
	if ep == engine.Completion {
		return "prompt"
	}
	return "messages"
}

// AdmitAndDispatch decides, waits in the waiting room while admission says queue, and runs the
// request on the chosen candidate or the next ones. When the candidates' owners refuse before
// the first byte, the request goes back to the waiting room (keeping its arrival time, so its
// TTL still bounds the whole wait), not to the client; when their attempts fail instead (an
// owner unreachable, its engine failing), the request ends with a 502 (see failures).
func (x *Executor) AdmitAndDispatch(ctx context.Context, w http.ResponseWriter, p *Request, start time.Time, explain bool) Outcome {
	// A step an agent window still holds when this returns ended without running.
	defer x.GiveUpAgent(p)
	x.retries.Request(start)
	// Its first token is due within its queue TTL of its arrival (a continuation's: of its
	// migration), wherever it waits.
	if p.Due.IsZero() { // set: a rerun after its delegate failed (delegate.go), renewed
		p.TTL = x.adm.TTL(p.Adm)
		p.Due = start.Add(p.TTL)
	}
	t := &Ticket{}
	var f attempt.Failures
	x.Decide(start, p, t, nil, nil)
	x.m.DecisionOf(t.D)
	x.m.ClassDecisions.WithLabelValues(admit.Class(p.Adm.Priority), t.D.Action.String()).Inc()
	for {
		if t.D.Action == admit.Queue {
			if x.wait(ctx, p, t) {
				return Outcome{Code: openai.CodeClientClosed, Refused: true}
			}
		}
		TraceDecision(ctx, p, t)
		x.explained(p, t)
		if explain && len(t.Cands) > 0 {
			w.Header().Set(HeaderExplain, route.Explain(t.Cands, 3))
		}
		if t.D.Refused() {
			e := ClientRefusal(p, t.D)
			if explain && len(t.Cands) > 0 {
				e.Message += " (candidates: " + route.Explain(t.Cands, 3) + ")"
			}
			WriteRefusal(w, e, t.D.RetryAfter)
			return Outcome{Code: e.Code, Refused: true}
		}
		p.Req.MaxTokens = t.D.MaxTokens
		ttft, tpot := x.adm.SLOFor(p.Adm)
		w.Header().Set(HeaderTTFTTarget, ttft.Round(time.Millisecond).String())
		w.Header().Set(HeaderTPOTTarget, tpot.Round(time.Millisecond).String())
		res := x.dispatch(ctx, w, p, t, start, &f)
		if !res.Requeue {
			x.KickRoom()
			return res.Outcome
		}
		if res.LastCode == CodeAgentPaused && x.agents != nil {
			if o, done := x.AwaitAgent(ctx, w, p, t); done {
				return o
			}
			continue
		}
		// Every owner said no: wait for room like any queued request.
		t.D = admit.Decision{Action: admit.Queue, Layer: admit.LayerQueue, Code: admit.CodeWaitKV, Option: -1,
			Tenant: p.Adm.Tenant, MaxTokens: t.D.MaxTokens, ExpectedTokens: t.D.ExpectedTokens, PrefillTokens: t.D.PrefillTokens}
	}
}

// Decide runs the planner for p: a new request when it is nil, else the queued item it; hold
// is the room the blocked head of its pool waits for (nil: none). It never blocks.
func (x *Executor) Decide(now time.Time, p *Request, t *Ticket, it *admit.Item, claim *admit.Claim) {
	x.host.BuildView(&t.View, p.Adm.Model, p.Adm.Parent, p.Req.Blocks, p.Adm.Agent, meshview.Rank{Priority: p.Adm.Priority, Arrived: p.Adm.Arrived})
	t.View.Exclude(p.Exclude)
	if it == nil {
		x.planner.Ingress(now, p.Adm, &t.View.View, &t.Plan)
	} else {
		x.planner.Queued(now, it, claim, &t.View.View, &t.Plan)
	}
	if p.Adm.OwnTTFT == 0 {
		p.Adm.OwnTTFT = t.D.OwnTTFT // the request's default TTFT target, fitted once to its size
	}
	if t.CarbonRouted {
		x.m.CarbonRouted.Inc()
	}
	if t.D.Action == admit.Accept && t.D.Option >= 0 && t.D.Option < len(t.Cands) && !p.AdapterRouted {
		// Once a request, at its first accept: one its owners refuse comes back to the
		// waiting room and is accepted again.
		if r := t.Cands[t.D.Option].Terms.Residency; r != route.ResidencyNone {
			x.m.AdapterRouted.WithLabelValues(r.String()).Inc()
			p.AdapterRouted = true
		}
	}
	if t.D.Code == plan.CodeCarbonDeferred {
		x.m.CarbonDeferred.Inc()
	}
}

// dispatch runs p on the candidates of t from the decision's choice on, as the attempt
// planner (attempt.Whole) says: this node's engine, a peer over QUIC, or a pair. Nothing
// reaches the client until some owner accepted. Failures, counted in f across dispatches,
// end the request (endFailed); refusals send it back to the waiting room.
func (x *Executor) dispatch(ctx context.Context, w http.ResponseWriter, p *Request, t *Ticket, start time.Time, f *attempt.Failures) Result {
	res := Result{Requeue: true, LastCode: admit.CodeNoCapacity}
	// The planner sees the candidates it may try: from the decision's choice (first), at most
	// ForwardAttempts of them; its index i is t.Cands[first+i].
	first := t.D.Option
	var buf [8]attempt.Cand
	cands := buf[:0]
	for i := first; i < len(t.Cands) && i-first < x.cfg.ForwardAttempts; i++ {
		cands = append(cands, candOf(&t.View, &t.Cands[i]))
	}
	d := attempt.Whole{Cands: cands, Attempts: x.cfg.ForwardAttempts, F: f}
	for s := d.Start(); ; s = d.Next(x.runAttempt(ctx, w, p, t, first+s.Cand, s, start, &res)) {
		switch s.Kind {
		case attempt.Answered:
			if s.Stick {
				x.Stick(p, cands[s.Cand].Name)
			}
			p.Parked = Parking{} // answered (it ran): no window keeps it parked any more
			return Result{Outcome: res.Outcome}
		case attempt.Requeue:
			return res
		case attempt.Fail:
			x.planner.Release(&t.Plan) // the decision's reservation, when its retry was refused
			return x.EndFailed(w, f)
		case attempt.Gone:
			return Result{Outcome: Outcome{Code: openai.CodeClientClosed, Refused: true}}
		case attempt.Migrate:
			cause := fmt.Errorf("%w: %s", errEngineFailed, res.Broke.Message)
			return Result{Outcome: x.Migrate(ctx, res.CS, p, x.cfg.Name, cause)}
		}
	}
}

// candOf is c as the attempt planner sees it.
func candOf(v *meshview.View, c *route.Candidate) attempt.Cand {
	return attempt.Cand{Name: c.Name, Peer: c.Peer, Self: v.Peers[c.Peer].Self, Pair: c.Pair != nil}
}

// runAttempt performs the attempt s of a dispatch (RunLocal, Forward or RunPair) on candidate
// i of t and reports how it ended; an answer's outcome is left in res.o.
func (x *Executor) runAttempt(ctx context.Context, w http.ResponseWriter, p *Request, t *Ticket, i int, s attempt.Step, start time.Time, res *Result) attempt.Result {
	c := &t.Cands[i]
	if s.Rerun {
		p.RenewDue(time.Now())
	}
	if s.Budget && !x.AllowRetry(p, c.Name) {
		return attempt.Result{Outcome: attempt.BudgetSpent}
	}
	if s.Reserve {
		x.planner.Reserve(time.Now(), p.Adm, &t.Plan, i)
	}
	if t.SplitWhy != "" {
		// Each candidate tried counts, as what it is: admission's choice, then fallbacks.
		x.m.Disagg.WithLabelValues(dispatchOutcome(&t.Plan, i)).Inc()
	}
	defer x.planner.Release(&t.Plan)
	switch s.Kind {
	case attempt.RunPair:
		var r attempt.Result
		res.Outcome, r = x.dispatchPair(ctx, w, p, t, c, start, res)
		return r
	case attempt.RunLocal:
		x.m.Forwards.WithLabelValues("local").Inc()
		return x.runLocal(ctx, w, p, c.Name, start, res)
	}
	addr := t.View.QUIC[c.Peer]
	o, done := x.forward(ctx, w, p, c.Name, addr, start, res)
	return x.afterForward(ctx, p, c.Name, addr, o, done, res)
}

// runLocal performs a RunLocal attempt: p on this node's engine, named name. The engine's
// failure is the planner's to hear, not the client's: before anything reached the client, the
// attempt failed (the next candidate runs the request); after a stream began, it broke, the
// client's stream kept in res.cs for the migration.
func (x *Executor) runLocal(ctx context.Context, w http.ResponseWriter, p *Request, name string, start time.Time, res *Result) attempt.Result {
	w = x.clientStream(w, p, res)
	p.MoveBreak = true
	o, ran := x.AgentStep(ctx, w, p, start, "local")
	p.MoveBreak = false
	if !ran {
		res.LastCode = CodeAgentPaused
		x.AgentRefused(p, name, "", res)
		return attempt.Result{Outcome: attempt.Paused}
	}
	return x.localResult(p, name, o, res)
}

// localResult is how a run of p on this node's engine (named name) that ended with o went, for
// the planner: answered, broke mid-response (res.broke), refused (the engine's 429), or failed
// before the client's first byte.
func (x *Executor) localResult(p *Request, name string, o Outcome, res *Result) attempt.Result {
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
		x.EngineBusy(p, name, o.Code, res)
		return attempt.Result{Outcome: attempt.Refused, Reason: res.LastCode, Now: time.Now()}
	}
	x.log.Warn("engine failed before the request's first byte; the next candidate runs it", "id", p.Req.ID,
		"code", o.Code, "err", o.Broke.Message)
	res.LastCode, res.FailCode = o.Code, o.Code
	return attempt.Result{Outcome: attempt.Failed, Code: o.Code, Reason: o.Code, Now: time.Now()}
}

// clientStream is the writer a local run of p answers on: for a stream, the client's stream
// (a continuation's goes on in the client's), kept in res.cs for a migration should the
// engine break mid-response.
func (x *Executor) clientStream(w http.ResponseWriter, p *Request, res *Result) http.ResponseWriter {
	if !p.Stream {
		return w
	}
	cs, ok := w.(*relay.Stream)
	if !ok {
		cs = relay.New(w, p.Endpoint == engine.Chat, x.cfg.Migrations >= 0)
	}
	res.CS = cs
	return cs
}

// afterForward is the result of a forward to owner at addr that answered the client (done, with
// o) or not (res says why).
func (x *Executor) afterForward(ctx context.Context, p *Request, owner, addr string, o Outcome, done bool, res *Result) attempt.Result {
	switch {
	case done:
		// An owner whose queue starved the request is no home.
		res.Outcome = o
		return attempt.Result{Outcome: attempt.Ran, Late: o.Code == openai.CodeEngineTimeout}
	case x.AgentRefused(p, owner, addr, res):
		return attempt.Result{Outcome: attempt.Paused, Code: res.FailCode}
	case ctx.Err() != nil:
		return attempt.Result{Outcome: attempt.ClientGone}
	case res.FailCode != "":
		return attempt.Result{Outcome: attempt.Failed, Code: res.FailCode, Reason: res.LastCode, Now: time.Now()}
	}
	return attempt.Result{Outcome: attempt.Refused, Reason: res.LastCode, Now: time.Now()}
}

func (x *Executor) Stick(p *Request, peer string) {
	if p.Adm.Agent != "" {
		x.planner.Policy().Stick(p.Adm.Agent, peer)
	}
}
