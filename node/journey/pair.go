package journey

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/admit/plan"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/node/attempt"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/firsttoken"
	"github.com/kvmesh/kvmesh/node/meshview"
	"github.com/kvmesh/kvmesh/node/metrics"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/transport"
)

// Disaggregated prefill and decode (docs/design/disaggregation.md). In a mesh with prefill or
// decode nodes the planner may choose, for a request, a pair instead of a whole candidate
// (route.Choose): a candidate with Pair set. The ingress then forwards the request to the
// prefill node p marked as a prefill (transport.Header.Prefill); p's engine computes the
// prompt's KV and p answers with the handover (transport.HandoverContentType), which the
// client never sees. The ingress forwards the request again to the decode node d with the
// handover in the header; d decodes from it and its chunks go to the client through the
// relay, as any owner's do, so the client reads one stream with one role chunk (and p's name
// in HeaderPrefillNode, which a request run whole never has), and a d that fails mid-stream is
// migrated like any owner. When p refuses or fails before the handover, the next prefill
// candidates are tried, then the request's whole candidates (mixed nodes), else it waits for
// room (every node refused) or ends with a 502 (attempts failed); when d refuses or fails
// before its first byte, the next decode candidates are tried with the same handover; when
// they all refused, the handover waits for decode room until the request's deadline
// (handoverDeadline), else the request ends with an explicit error (CodeDecodeUnavailable,
// CodeDecodeFailed). Either half may run on this node itself.

// dispatchOutcome is the kvmesh_route_disaggregated_total outcome of dispatching candidate i
// of pl (admission's choice, pl.D.Option, or a fallback after it) in a mesh with prefill or
// decode nodes: split on a pair; whole on the decode node the split rule chose, for its
// reason; whole on a mixed node for the rule's reason when the rule chose to run the request
// whole there, else whole_no_pair (the rule chose the pair or the decode node, and admission
// or their owners passed them over).
func dispatchOutcome(pl *plan.Plan, i int) string {
	c := &pl.Cands[i]
	switch {
	case c.Pair != nil:
		return metrics.DisaggSplit
	case route.RunsLocal(pl.SplitWhy) && (len(pl.Search.Local) == 0 || c.Name != pl.Search.Local[0].Name):
		return metrics.DisaggWholeNoPair
	}
	return wholeOutcome(pl.SplitWhy)
}

// wholeOutcome is the metric outcome of the split rule's reason for a whole request: a reason
// to split (the request then runs whole on a mixed node admission chose instead) is
// whole_no_pair.
func wholeOutcome(why string) string {
	switch why {
	case route.WholeShort:
		return metrics.DisaggWholeShort
	case route.WholeLink:
		return metrics.DisaggWholeLink
	case route.WholeMixedFast:
		return metrics.DisaggWholeMixed
	case route.WholeDecodeShort:
		return metrics.DisaggDecodeShort
	case route.WholePrefillBehind:
		return metrics.DisaggPrefillBehind
	}
	return metrics.DisaggWholeNoPair
}

// HandoverHeader and handoverOf carry engine.Handover over the wire as transport.Handover; the
// prompt's blocks are the request's own (blocks), not sent.
func HandoverHeader(h *engine.Handover) *transport.Handover {
	if h == nil {
		return nil
	}
	return &transport.Handover{PromptTokens: h.PromptTokens, CachedTokens: h.CachedTokens, KVBytes: h.KVBytes, ReadyAt: h.ReadyAt, Params: h.Params}
}

func HandoverOf(h *transport.Handover, blocks []uint64) *engine.Handover {
	if h == nil {
		return nil
	}
	return &engine.Handover{Blocks: blocks, PromptTokens: h.PromptTokens, CachedTokens: h.CachedTokens, KVBytes: h.KVBytes, ReadyAt: h.ReadyAt, Params: h.Params}
}

// Prefill runs the prefill half of p on this node's engine and returns the handover.
func (x *Executor) Prefill(ctx context.Context, p *Request) (*engine.Handover, error) {
	half := *p
	half.Req.PrefillOnly, half.Req.Handover = true, nil
	st, err := x.Generate(ctx, &half)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	for {
		c, err := st.Recv()
		switch {
		case err == io.EOF:
			return nil, fmt.Errorf("%w: the engine ended a prefill without a handover", engine.ErrUnavailable)
		case err != nil:
			return nil, err
		case c.FinishReason == engine.FinishHandover && c.Handover != nil:
			return c.Handover, nil
		case c.FinishReason != "":
			return nil, fmt.Errorf("%w: the engine finished a prefill with %q, not a handover", engine.ErrUnavailable, c.FinishReason)
		}
	}
}

// ServePrefill answers a forwarded prefill half: the handover of p's prompt, or the engine's
// error as Executor.ServeLocal would answer it.
func (x *Executor) ServePrefill(ctx context.Context, w http.ResponseWriter, p *Request) Outcome {
	x.m.Served.WithLabelValues("peer").Inc()
	h, err := x.Prefill(ctx, p)
	var body []byte
	if err == nil {
		body, err = transport.AppendHandover(nil, HandoverHeader(h))
	}
	if err != nil {
		e := EngineError(err)
		if ctx.Err() != nil {
			e = openai.NewError(499, openai.CodeClientClosed, "client closed the request")
		}
		WriteRefusal(w, e, 0)
		return Outcome{Code: e.Code, Refused: e.Status < 500}
	}
	w.Header().Set("Content-Type", transport.HandoverContentType)
	w.Header().Set(HeaderNode, x.cfg.Name)
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(body); err != nil {
		return Outcome{Code: openai.CodeClientClosed}
	}
	return Outcome{Completed: true}
}

// decodePeers is every other peer of v that can decode model and is not in have: a waiting
// handover is offered to any decode node that has room by now, the ones the search left out
// as busy, or as having refused lately, included.
func decodePeers(v *meshview.View, model, from string, have []attempt.Cand) []attempt.Cand {
	var more []attempt.Cand
	for i := range v.Peers {
		q := &v.Peers[i]
		switch {
		case q.Name == from, q.WholeOnly, !q.Healthy, q.Ejected, q.Role != route.RoleDecode && !route.IsMixed(q.Role),
			!slices.Contains(q.Models, model),
			slices.ContainsFunc(have, func(c attempt.Cand) bool { return c.Name == q.Name }):
			continue
		}
		more = append(more, attempt.Cand{Peer: i, Name: q.Name, Self: q.Self})
	}
	return more
}

// handoverRetry is how often a handover every decode node refused is offered to them again:
// a few decode steps, so a seat freed is taken within a step or two of it.
const handoverRetry = 20 * time.Millisecond

// handoverDeadline is how long a handover may wait for decode room: until the request's TTFT
// deadline or the end of its queue TTL (p.due), whichever comes first.
func (x *Executor) handoverDeadline(p *Request) time.Time {
	ttft, _ := x.adm.SLOFor(p.Adm)
	deadline := p.Adm.SLOClock().Add(ttft)
	end := p.Due
	if end.IsZero() {
		end = p.Adm.Arrived.Add(x.adm.TTL(p.Adm))
	}
	if end.Before(deadline) {
		deadline = end
	}
	return deadline
}

// maxHandoverAnswer bounds a prefill owner's answer body: the params and four uvarints.
const maxHandoverAnswer = transport.MaxHandoverParams + 64

// prefillOn runs p's prefill half on candidate q (this node or a peer) and returns its
// handover; nil when q refused or the attempt failed (res.failCode), done when the client was
// answered (the owner found the request itself invalid).
func (x *Executor) prefillOn(ctx context.Context, w http.ResponseWriter, p *Request, q attempt.Cand, v *meshview.View, res *Result) (*engine.Handover, Outcome, bool) {
	res.FailCode = ""
	if q.Self {
		x.m.Forwards.WithLabelValues("local").Inc()
		x.m.Served.WithLabelValues("local").Inc()
		h, err := x.Prefill(ctx, p)
		if err == nil {
			return h, Outcome{}, false
		}
		e := EngineError(err)
		if e.Status == http.StatusBadRequest || errors.As(err, new(*firsttoken.Late)) {
			// The request itself is at fault, or its deadline passed: no other node would do
			// better.
			WriteRefusal(w, e, 0)
			return nil, Outcome{Code: e.Code, Refused: e.Status < 500}, true
		}
		res.LastCode, res.FailCode = e.Code, e.Code
		return nil, Outcome{}, false
	}
	resp, o, done := x.send(ctx, w, p, q.Name, v.QUIC[q.Peer], true, res)
	if resp == nil {
		return nil, o, done
	}
	defer resp.Body.Close()
	if resp.Status != http.StatusOK {
		// The owner's answer to the client's request itself (a 4xx): it goes to the client as
		// a whole response's would.
		return nil, x.RelayWhole(ctx, w, resp, p, q.Name, time.Now()), true
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxHandoverAnswer))
	if err != nil {
		// The owner failed before its handover was whole.
		res.LastCode, res.FailCode = CodeOwnerUnreachable, CodeOwnerUnreachable
		x.log.Debug("prefill owner failed mid-answer", "id", p.Req.ID, "owner", q.Name, "err", err)
		return nil, Outcome{}, false
	}
	th, err := transport.DecodeHandover(body)
	if err != nil || resp.Headers["Content-Type"] != transport.HandoverContentType {
		res.LastCode, res.FailCode = openai.CodeEngineError, openai.CodeEngineError
		x.log.Warn("prefill owner answered without a handover", "id", p.Req.ID, "owner", q.Name, "err", err)
		return nil, Outcome{}, false
	}
	if x.g != nil {
		// The prefill owner now caches this prefix: a next turn should prefill there.
		x.g.Index().AddSpeculative(q.Name, p.Req.Blocks, time.Now().Add(x.cfg.SpeculativeTTL))
	}
	return HandoverOf(th, p.Req.Blocks), Outcome{}, false
}

// dispatchPair runs p on the pair candidate c: the prefill on c's prefill peer (or the next
// Prefill candidates, as attempt.Prefill plans), then the decode (decodeHandover), whose
// answer goes to the client. The result is Ran when the client got an answer (o); otherwise no
// Prefill node handed over, and it says whether they refused or one failed.
func (x *Executor) dispatchPair(ctx context.Context, w http.ResponseWriter, p *Request, t *Ticket, c *route.Candidate, start time.Time, res *Result) (Outcome, attempt.Result) {
	defer func() { p.Req.Handover = nil }() // a fallback runs whole
	pr := c.Pair
	cands := make([]attempt.Cand, 0, 1+len(t.Search.Prefill))
	cands = append(cands, candOf(&t.View, &pr.Prefill))
	for i := range t.Search.Prefill {
		cands = append(cands, candOf(&t.View, &t.Search.Prefill[i]))
	}
	pf := attempt.Prefill{Cands: cands, Attempts: x.cfg.ForwardAttempts}
	var h *engine.Handover
	var o Outcome
	s := pf.Start()
	for s.Kind == attempt.RunPrefill {
		var r attempt.Result
		h, o, r = x.prefillStep(ctx, w, p, t, cands[s.Cand], s, res)
		s = pf.Next(r)
	}
	ran := attempt.Result{Outcome: attempt.Ran}
	switch s.Kind {
	case attempt.Answered:
		return o, ran
	case attempt.Gone:
		return Outcome{Code: openai.CodeClientClosed, Refused: true}, ran
	case attempt.Handed:
		o = x.decodeHandover(ctx, w, p, t, pr, cands[s.Cand].Name, h, start, res)
		if res.Broke != nil {
			// This node's engine broke mid-decode: the dispatch migrates the rest, whole.
			return Outcome{}, attempt.Result{Outcome: attempt.Broke}
		}
		return o, ran
	}
	x.m.Disagg.WithLabelValues(metrics.DisaggPrefillFailed).Inc()
	x.log.Debug("no prefill node handed over", "id", p.Req.ID, "tries", pf.Tries(), "code", s.Code)
	if s.Kind == attempt.Fail {
		return Outcome{}, attempt.Result{Outcome: attempt.Failed, Code: s.Code}
	}
	return Outcome{}, attempt.Result{Outcome: attempt.Refused} // every prefill node refused: the request waits for room
}

// prefillStep performs s, a prefill attempt on q, and reports how it ended: with the handover
// h, or the client's answer o.
func (x *Executor) prefillStep(ctx context.Context, w http.ResponseWriter, p *Request, t *Ticket, q attempt.Cand, s attempt.Step, res *Result) (h *engine.Handover, o Outcome, r attempt.Result) {
	switch {
	case s.Budget && !x.AllowRetry(p, q.Name):
		r.Outcome = attempt.BudgetSpent
	default:
		if s.Rerun {
			x.m.Disagg.WithLabelValues(metrics.DisaggPrefillRetried).Inc()
			p.RenewDue(time.Now())
		}
		var done bool
		h, o, done = x.prefillOn(ctx, w, p, q, &t.View, res)
		switch {
		case done:
			return nil, o, attempt.Result{Outcome: attempt.Ran}
		case h != nil:
			r.Outcome = attempt.HandedOver
		case res.FailCode != "":
			r = attempt.Result{Outcome: attempt.Failed, Code: res.FailCode}
		default:
			r.Outcome = attempt.Refused
		}
	}
	if ctx.Err() != nil {
		r.Outcome = attempt.ClientGone
	}
	return h, o, r
}

// decodeHandover runs the decode half of p, whose prompt from prefilled into h, on pr's decode
// peer or the next decode candidates, as attempt.Decode plans: when they all refuse, the
// handover waits for decode room until the request's deadline (handoverDeadline), else the
// request ends with an explicit error. The client is answered.
func (x *Executor) decodeHandover(ctx context.Context, w http.ResponseWriter, p *Request, t *Ticket, pr *route.Pair, from string, h *engine.Handover, start time.Time, res *Result) Outcome {
	x.m.Disagg.WithLabelValues(metrics.DisaggHandover).Inc()
	p.Req.Handover = h
	// The client's response names the prefill node from here on, whichever decode node
	// answers (an owner's answer does not override it: ingressHeader). A request that falls
	// back to a whole run never gets here.
	w.Header().Set(HeaderPrefillNode, from)
	search := make([]attempt.Cand, len(t.Search.Decode))
	for i := range t.Search.Decode {
		search[i] = candOf(&t.View, &t.Search.Decode[i])
	}
	dec := attempt.NewDecode(candOf(&t.View, &pr.Decode), search, from, x.cfg.ForwardAttempts, x.handoverDeadline(p), handoverRetry)
	for s := dec.Start(time.Now()); ; {
		switch s.Kind {
		case attempt.RunDecode:
			s = dec.Next(x.decodeStep(ctx, w, p, t, dec.Cands[s.Cand], s, start, res))
		case attempt.Widen:
			x.m.Disagg.WithLabelValues(metrics.DisaggHandoverQueued).Inc()
			dec.Widen(decodePeers(&t.View, p.Adm.Model, from, dec.Cands))
			s = dec.Next(attempt.Result{Outcome: attempt.Widened})
		case attempt.WaitDecodeRoom:
			s = dec.Next(waitRoom(ctx, s.Wait))
		case attempt.Answered:
			if s.Stick {
				x.Stick(p, dec.Cands[s.Cand].Name)
			}
			return res.Outcome
		case attempt.Gone:
			return Outcome{Code: openai.CodeClientClosed, Refused: true}
		case attempt.Migrate:
			return Outcome{} // res.broke: the dispatch moves the request on
		default:
			return x.decodeFailed(w, p, dec, from, start)
		}
	}
}

// waitRoom waits d, or until the client leaves.
func waitRoom(ctx context.Context, d time.Duration) attempt.Result {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return attempt.Result{Outcome: attempt.ClientGone}
	case <-timer.C:
		return attempt.Result{Outcome: attempt.Waited, Now: time.Now()}
	}
}

// decodeStep performs s, the offer of p's handover to d, and reports how it ended; an answer's
// outcome is left in res.o.
func (x *Executor) decodeStep(ctx context.Context, w http.ResponseWriter, p *Request, t *Ticket, d attempt.Cand, s attempt.Step, start time.Time, res *Result) attempt.Result {
	if s.Rerun {
		x.m.Disagg.WithLabelValues(metrics.DisaggDecodeRetried).Inc()
		p.RenewDue(time.Now())
	}
	x.planner.Handover(time.Now(), &t.Plan, d.Name)
	if d.Self {
		// As a whole local run (runLocal): the engine's failure mid-response moves the request
		// on, and one before the first byte is the attempt's.
		x.m.Forwards.WithLabelValues("local").Inc()
		w = x.clientStream(w, p, res)
		p.MoveBreak = true
		o := x.ServeLocal(ctx, w, p, start, "local")
		p.MoveBreak = false
		r := x.localResult(p, d.Name, o, res)
		r.Late = o.Code == openai.CodeEngineTimeout
		return r
	}
	o, done := x.forward(ctx, w, p, d.Name, t.View.QUIC[d.Peer], start, res)
	if done {
		res.Outcome = o
		return attempt.Result{Outcome: attempt.Ran, Late: o.Code == openai.CodeEngineTimeout}
	}
	if ctx.Err() != nil {
		return attempt.Result{Outcome: attempt.ClientGone}
	}
	if res.FailCode != "" {
		return attempt.Result{Outcome: attempt.Failed, Code: res.FailCode, Reason: res.LastCode, Now: time.Now()}
	}
	return attempt.Result{Outcome: attempt.Refused, Reason: res.LastCode, Now: time.Now()}
}

// decodeFailed ends p, whose handover from no decode node took, with the planner's code.
func (x *Executor) decodeFailed(w http.ResponseWriter, p *Request, dec *attempt.Decode, from string, start time.Time) Outcome {
	x.m.Disagg.WithLabelValues(metrics.DisaggDecodeFailed).Inc()
	e := openai.NewError(http.StatusServiceUnavailable, attempt.CodeDecodeUnavailable,
		fmt.Sprintf("the prompt was prefilled on node %s, but no decode node took its KV until the request's deadline (%d tries over %v; the last said %s)",
			from, dec.Tries(), time.Since(start).Round(time.Millisecond), dec.Reason()))
	if dec.FailCode() != "" {
		e = openai.NewError(http.StatusBadGateway, attempt.CodeDecodeFailed,
			fmt.Sprintf("the prompt was prefilled on node %s, but no decode node could run it (%d tried; a failure: %s)", from, dec.Tries(), dec.FailCode()))
	}
	x.log.Warn("a split request's handover found no decode node", "id", p.Req.ID, "prefill", from, "tries", dec.Tries(), "code", e.Code)
	WriteRefusal(w, e, x.cfg.RetryAfter)
	return Outcome{Code: e.Code, Refused: dec.FailCode() == ""}
}
