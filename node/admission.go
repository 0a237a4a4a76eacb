package node

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/openai"
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

// CodeCarbonDeferred is the refusal of a sheddable request when every grid with room is dirty.
const CodeCarbonDeferred = "carbon_deferred"

// parseHeaders fills the admission fields that come from X-Kvmesh-* headers.
func parseHeaders(h http.Header, a *admit.Request) *openai.Error {
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
	if len(a.Agent) > 256 {
		return openai.NewError(http.StatusBadRequest, openai.CodeInvalidParameter, HeaderAgent+" is longer than 256 bytes").WithParam(HeaderAgent)
	}
	return nil
}

func bearer(h http.Header) string {
	v := h.Get("Authorization")
	if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
		return strings.TrimSpace(v[7:])
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

// ingest runs one client request through the pipeline of DESIGN.md: decode, validate,
// identity, budget, route, admit, wait, dispatch.
func (n *Node) ingest(ctx context.Context, w http.ResponseWriter, r *http.Request, ep engine.Endpoint, id string, start time.Time) outcome {
	refuse := func(e *openai.Error, retry time.Duration) outcome {
		writeRefusal(w, e, retry)
		return outcome{code: e.Code, refused: true}
	}
	// The body must be JSON whatever Content-Type says: curl -d sends form encoding by default.
	body, oerr := readBody(r.Body, n.cfg.MaxBodyBytes)
	var p *prepared
	if oerr == nil {
		p, oerr = n.prepare(ep, id, body)
	}
	if oerr == nil {
		oerr = parseHeaders(r.Header, &p.adm)
	}
	if oerr != nil {
		n.m.decision(admit.LayerValidation, admit.Refuse, oerr.Code)
		return refuse(oerr, 0)
	}
	a := &p.adm
	a.Arrived, a.APIKey = start, bearer(r.Header)
	if a.Agent == "" && n.cfg.AgentFromUser {
		a.Agent = p.user
	}
	switch v := r.Header.Get(HeaderAgentFinal); v {
	case "", "0", "false":
	case "1", "true":
		p.agentFinal = a.Agent != ""
	default:
		n.m.decision(admit.LayerValidation, admit.Refuse, openai.CodeInvalidParameter)
		return refuse(openai.NewError(http.StatusBadRequest, openai.CodeInvalidParameter,
			HeaderAgentFinal+" must be 1 or 0").WithParam(HeaderAgentFinal), 0)
	}
	if d := n.adm.Validate(*a); d.Refused() {
		n.m.decisionOf(d)
		return refuse(refusalOf(d), 0)
	}
	tenant, d := n.adm.Identify(start, *a)
	if d.Refused() {
		n.m.decisionOf(d)
		return refuse(refusalOf(d), d.RetryAfter)
	}
	a.Tenant = tenant
	a.APIKey = "" // identified; the raw key goes no further
	explain := r.Header.Get(HeaderExplain) == "1"
	if n.cfg.Standalone {
		// kvmesh engine is an engine, not a mesh: like vLLM it queues whatever can ever run and
		// refuses only what cannot (context, KV budget).
		d := n.adm.Admit(start, *a, []admit.Option{n.localOption()})
		n.m.decisionOf(d)
		if d.Refused() && d.Status == http.StatusBadRequest {
			return refuse(refusalOf(d), 0)
		}
		p.req.MaxTokens = d.MaxTokens
		return n.serveLocal(ctx, w, p, start, "local")
	}
	return n.admitAndDispatch(ctx, w, p, start, explain)
}

// plan is one routing and admission pass: the candidates best first, the decision, and the
// reservation an accept made on its chosen candidate.
type plan struct {
	v        view
	cands    []route.Candidate
	opts     []admit.Option
	d        admit.Decision
	res      route.Reservation
	reserved bool
}

// decide routes p over the current view and asks admission (Admit for a new request, Ready
// for a queued one); it never blocks. An accept reserves its tokens and blocks on the chosen
// candidate at once, so the next decision sees them before any gossip does.
func (n *Node) decide(now time.Time, p *prepared, pl *plan) { n.decideQueued(now, p, pl, nil, nil) }

func (n *Node) decideQueued(now time.Time, p *prepared, pl *plan, it *admit.Item, hold *admit.Hold) {
	a := &p.adm
	n.buildView(&pl.v, p.req.Blocks)
	rreq := route.Request{
		Model: a.Model, PromptTokens: a.PromptTokens, MaxTokens: deref(a.MaxTokens), Priority: a.Priority,
		Session: a.Agent, BlockTokens: n.blockTokens(), StayHome: n.agents != nil && a.Agent != "",
		KeepBusy: n.cfg.Admission != AdmissionKvmesh, // no waiting room: the engine queues
	}
	if rreq.StayHome {
		n.homeHere(&pl.v, a.Agent)
	}
	var err error
	pl.cands, err = n.policy.Route(now, rreq, pl.v.peers, pl.cands[:0])
	pl.opts = pl.opts[:0]
	var nce *route.NoCandidateError
	switch {
	case err == nil:
	case errors.As(err, &nce) && nce.Busy():
		// Every host is busy: admission sees them with no room, so it queues (or sheds).
		n.busyOptions(pl, a.Model)
	default:
		pl.d = admit.Decision{Action: admit.Refuse, Status: http.StatusServiceUnavailable, Layer: admit.LayerRoute,
			Code: admit.CodeNoCapacity, Message: "no node can serve model " + a.Model + " now: " + err.Error(), RetryAfter: time.Second}
		return
	}
	if n.carbon != nil && a.Priority < 0 && len(pl.cands) > 0 && !n.carbonFilter(now, pl) {
		return
	}
	// A step of an agent goes to its home and nowhere else, where its context and its window
	// are; it still waits here for KV room there like any request, so the window's agents
	// cannot push the engine into preemption.
	if rreq.StayHome && len(pl.cands) > 0 && pl.cands[0].Sticky {
		pl.cands = pl.cands[:1]
	}
	for i := range pl.cands {
		pl.opts = append(pl.opts, n.optionOf(now, &pl.cands[i], &pl.v))
	}
	if hold != nil {
		hold.Take(pl.opts) // it runs beside a blocked head only on room the head does not wait for
	}
	if it != nil {
		pl.d = n.adm.Ready(now, it, pl.opts)
	} else {
		pl.d = n.adm.Admit(now, *a, pl.opts)
	}
	if rreq.StayHome && pl.d.Code == admit.CodeSLOUnattainable {
		n.decideAgentStep(now, p, pl, it)
	}
	if n.cfg.Admission != AdmissionKvmesh {
		n.plainAdmission(pl)
	}
	if pl.d.Action == admit.Accept && pl.d.Option >= len(pl.cands) {
		// Only busy hosts were offered (routing found none with room); never run on one of them.
		pl.d.Action, pl.d.Layer, pl.d.Code, pl.d.Option = admit.Queue, admit.LayerKV, admit.CodeWaitKV, -1
	}
	if pl.d.Action == admit.Accept {
		c := &pl.cands[pl.d.Option]
		pl.res = n.policy.Reserve(now, c.Name, max(a.PromptTokens-c.Terms.PrefixTokens, 0), pl.d.KVBlocks)
		pl.reserved = true
	}
}

// agentStepSLO is the TTFT and TPOT target an agent step is decided again with when its own
// cannot be met: none that matters, as the queue TTL bounds the wait.
const agentStepSLO = 24 * time.Hour

// decideAgentStep decides again, without its SLO, a step of an agent that the SLO check
// refused. With agent admission on, an agent's steps are admitted by its home's window, not
// per request: an active agent's step is part of the agent, and refusing it for a predicted
// TTFT would only send its client away for a Retry-After while its slot, and the KV the
// window keeps for it, sit idle. Decided again, the step still waits here for KV room at its
// home (and within the room's caps), so the window's agents cannot push the engine into
// preemption; the home then runs it if its agent is active, holds it if the agent is outside
// the window, and checks a new agent's first step the same way (for KV room, not for time).
func (n *Node) decideAgentStep(now time.Time, p *prepared, pl *plan, it *admit.Item) {
	req := withoutSLO(p.adm)
	if it == nil {
		pl.d = n.adm.Admit(now, req, pl.opts)
		return
	}
	relaxed := *it
	relaxed.Req = req
	pl.d = n.adm.Ready(now, &relaxed, pl.opts)
}

// withoutSLO is req with the SLO of an agent step decided again (agentStepSLO).
func withoutSLO(req admit.Request) admit.Request {
	req.TTFTSLO, req.TPOTSLO = agentStepSLO, agentStepSLO
	return req
}

// releasePlan gives back the reservation of an accept that will not run.
func (n *Node) releasePlan(pl *plan) {
	if pl.reserved {
		n.policy.Release(pl.res)
		pl.reserved = false
	}
}

// carbonFilter applies the shedding rule to a sheddable request: it runs only where the grid
// is under the threshold, so dirty candidates are dropped, and with none left it is refused
// with carbon_deferred. It reports whether to go on.
func (n *Node) carbonFilter(now time.Time, pl *plan) bool {
	kept := pl.cands[:0]
	for _, c := range pl.cands {
		if !pl.v.carbon[c.Peer] {
			kept = append(kept, c)
		}
	}
	if len(kept) < len(pl.cands) && len(kept) > 0 {
		n.m.carbonRouted.Inc()
	}
	pl.cands = kept
	if len(kept) == 0 {
		pl.d = carbonDeferred(n.carbon.RetryAfter(now))
		n.m.carbonDeferred.Inc()
		return false
	}
	return true
}

func carbonDeferred(retry time.Duration) admit.Decision {
	return admit.Decision{Action: admit.Refuse, Status: http.StatusTooManyRequests, Layer: "carbon",
		Code: CodeCarbonDeferred, Message: "sheddable request deferred: every grid with room is over the carbon threshold",
		RetryAfter: retry}
}

// plainAdmission replaces the load-aware verdict with what a plain router does: send it to
// the first candidate now (the engine queues it), refusing only requests that can never run
// and, in queue-cap mode, requests whose engine already has QueueCap waiting.
func (n *Node) plainAdmission(pl *plan) {
	if pl.d.Refused() && (pl.d.Status == http.StatusBadRequest || pl.d.Status == http.StatusNotFound || len(pl.cands) == 0) {
		return
	}
	if len(pl.cands) == 0 {
		return
	}
	if n.cfg.Admission == AdmissionQueueCap {
		if p := &pl.v.peers[pl.cands[0].Peer]; p.Waiting >= n.cfg.QueueCap {
			pl.d = admit.Decision{Action: admit.Refuse, Status: http.StatusTooManyRequests, Layer: admit.LayerQueue,
				Code: admit.CodeQueueFull, Message: fmt.Sprintf("the engine has %d requests waiting", p.Waiting),
				RetryAfter: time.Second, MaxTokens: pl.d.MaxTokens, Tenant: pl.d.Tenant}
			return
		}
	}
	pl.d = admit.Decision{Action: admit.Accept, Layer: admit.LayerRoute, Code: admit.CodeAccepted, Option: 0,
		MaxTokens: pl.d.MaxTokens, ExpectedTokens: pl.d.ExpectedTokens, Tenant: pl.d.Tenant, KVBlocks: pl.d.KVBlocks}
}

// optionOf maps a route candidate into admission's view of it.
func (n *Node) optionOf(now time.Time, c *route.Candidate, v *view) admit.Option {
	p := &v.peers[c.Peer]
	bt := n.blockTokens()
	free := p.KVBlocksTotal - p.KVBlocksUsed - queuedBlocks(p.QueuedPrefillTokens, bt) - c.Terms.ReservedBlocks
	return admit.Option{
		Peer: c.Name, PredictedTTFT: c.PredictedTTFT, PredictedTPOT: c.PredictedTPOT,
		FreeKVBlocks: max(free, 0), TotalKVBlocks: p.KVBlocksTotal, BlockTokens: bt,
		CachedTokens: c.Terms.PrefixTokens, PrefillTokensPerSecond: p.PrefillTokensPerSecond,
	}
}

// queuedBlocks is the KV the engine's queued prefill will take before a new request runs: its
// queue is first come first served and its head waits for blocks (as vLLM's does), so the blocks
// free now are not free for a request behind it (admit.Option.FreeKVBlocks).
func queuedBlocks(tokens, blockTokens int) int {
	if tokens <= 0 || blockTokens <= 0 {
		return 0
	}
	return (tokens + blockTokens - 1) / blockTokens
}

// busyOptions lists the busy hosts of model as options, when routing found none with room.
func (n *Node) busyOptions(pl *plan, model string) {
	for i := range pl.v.peers {
		p := &pl.v.peers[i]
		hosts := false
		for _, m := range p.Models {
			hosts = hosts || m == model
		}
		if !hosts || !p.Healthy {
			continue
		}
		var ttft time.Duration
		if p.PrefillTokensPerSecond > 0 {
			ttft = time.Duration(float64(p.QueuedPrefillTokens) / p.PrefillTokensPerSecond * float64(time.Second))
		}
		// Its free KV as it is: the blocked head's hold goes where it fits first
		// (Admitter.HoldFor). An accept on a busy host never runs (decideQueued).
		bt := n.blockTokens()
		free := p.KVBlocksTotal - p.KVBlocksUsed - queuedBlocks(p.QueuedPrefillTokens, bt)
		pl.opts = append(pl.opts, admit.Option{Peer: p.Name, PredictedTTFT: ttft, FreeKVBlocks: max(free, 0),
			TotalKVBlocks: p.KVBlocksTotal, BlockTokens: bt, PrefillTokensPerSecond: p.PrefillTokensPerSecond})
	}
}

// localOption is this node's exact state as the single option of an owner's re-check.
func (n *Node) localOption() admit.Option {
	st := n.eng.State()
	var ttft time.Duration
	if st.PrefillTokensPerSecond > 0 {
		ttft = time.Duration(float64(st.QueuedPrefillTokens) / st.PrefillTokensPerSecond * float64(time.Second))
	}
	return admit.Option{Peer: n.cfg.Name, PredictedTTFT: ttft, PredictedTPOT: time.Duration(st.DecodeStepSeconds * float64(time.Second)),
		FreeKVBlocks: max(st.KVBlocksTotal-st.KVBlocksUsed-queuedBlocks(st.QueuedPrefillTokens, st.BlockTokens), 0), TotalKVBlocks: st.KVBlocksTotal, BlockTokens: st.BlockTokens,
		PrefillTokensPerSecond: st.PrefillTokensPerSecond}
}

// admitAndDispatch decides, waits in the waiting room while admission says queue, and runs the
// request on the chosen candidate or the next ones. When every candidate's owner refuses
// before the first byte, the request goes back to the waiting room (keeping its arrival time,
// so its TTL still bounds the whole wait), not to the client.
func (n *Node) admitAndDispatch(ctx context.Context, w http.ResponseWriter, p *prepared, start time.Time, explain bool) outcome {
	// A step an agent window still holds when this returns ended without running.
	defer n.giveUpAgent(p)
	pl := &plan{}
	n.decide(start, p, pl)
	n.m.decisionOf(pl.d)
	for {
		if pl.d.Action == admit.Queue {
			if res := n.wait(ctx, p, pl); res.gone {
				return outcome{code: openai.CodeClientClosed, refused: true}
			}
		}
		if explain && len(pl.cands) > 0 {
			w.Header().Set(HeaderExplain, route.Explain(pl.cands, 3))
		}
		if pl.d.Refused() {
			e := refusalOf(pl.d)
			if explain && len(pl.cands) > 0 {
				e.Message += " (candidates: " + route.Explain(pl.cands, 3) + ")"
			}
			writeRefusal(w, e, pl.d.RetryAfter)
			return outcome{code: e.Code, refused: true}
		}
		p.req.MaxTokens = pl.d.MaxTokens
		res := n.dispatch(ctx, w, p, pl, pl.cands[pl.d.Option:], start)
		if !res.requeue {
			n.kickRoom()
			return res.o
		}
		if res.lastCode == CodeAgentPaused && n.agents != nil {
			if o, done := n.awaitAgent(ctx, w, p, pl); done {
				return o
			}
			continue
		}
		// Every owner said no: wait for room like any queued request.
		pl.d = admit.Decision{Action: admit.Queue, Layer: admit.LayerQueue, Code: admit.CodeWaitKV, Option: -1,
			Tenant: p.adm.Tenant, MaxTokens: pl.d.MaxTokens, ExpectedTokens: pl.d.ExpectedTokens, PrefillTokens: pl.d.PrefillTokens}
	}
}

func deref(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}
