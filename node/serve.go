package node

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/engine/external"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/render"
)

// serveLocal runs p on this node's engine and writes the OpenAI response to w. Nothing is
// written until the first token exists, so an engine failure before it is still a clean 502
// (and, for a forwarded request, lets the ingress try another peer). When p.moveBreak, an
// engine failure, before the first token or mid-response, is left unwritten (outcome.broke)
// for the caller to move the request elsewhere.
func (n *Node) serveLocal(ctx context.Context, w http.ResponseWriter, p *prepared, start time.Time, origin string) outcome {
	n.m.served.WithLabelValues(origin).Inc()
	native := n.nativeRun(p)
	st, err := n.generate(ctx, p)
	if err != nil {
		// The engine said no before any output: a 4xx is a refusal (the client's request), the
		// rest a failure (the engine's).
		e := cmp.Or(n.drainCut(ctx), engineError(err))
		if o, ok := brokenRun(ctx, p, e, false); ok {
			return o
		}
		writeRefusal(w, e, 0)
		return outcome{code: e.Code, refused: e.Status < 500}
	}
	defer st.Close()
	first, err := st.Recv()
	if err != nil {
		e := engineError(err)
		if ctx.Err() != nil {
			e = cmp.Or(n.drainCut(ctx), openai.NewError(499, openai.CodeClientClosed, "client closed the request"))
		}
		if o, ok := brokenRun(ctx, p, e, false); ok {
			return o
		}
		writeRefusal(w, e, 0)
		return outcome{code: e.Code}
	}
	firstAt := time.Now()
	if origin == "local" && p.origin == nil { // a continuation's first token is not the request's
		n.m.ttft.Observe(firstAt.Sub(start).Seconds())
	}
	n.inFlightTokens.Add(int64(p.req.MaxTokens))
	defer n.inFlightTokens.Add(-int64(p.req.MaxTokens))
	w.Header().Set(HeaderNode, n.cfg.Name)
	enc := render.New(p.endpoint, p.req.ID, p.model.Name, p.includeUsage, firstAt)
	var o outcome
	var u *engine.Usage
	switch {
	case native:
		o, u = n.answerNative(ctx, w, p, st, first)
	case p.stream:
		o, u = n.stream(ctx, w, p, st, first, enc)
	default:
		o, u = n.collect(ctx, w, p, st, first, enc)
	}
	if o.completed && u != nil {
		n.finished(p, firstAt, time.Now(), u)
	}
	return o
}

// brokenRun is the outcome of a run of p whose engine failed with e, before the client's
// response began or after (begun), when its caller moves such a request elsewhere
// (p.moveBreak): ok false when it does not, or when e is not the engine's failure but the
// client's leaving, this node's drain, the request itself (4xx) or a first token later than
// its deadline, which no other engine would beat. The engine's own overload (429) before the
// response began is moved on too: another node's engine may have room.
func brokenRun(ctx context.Context, p *prepared, e *openai.Error, begun bool) (o outcome, ok bool) {
	busy := e.Status == http.StatusTooManyRequests && !begun
	if !p.moveBreak || ctx.Err() != nil || (e.Status < 500 && !busy) || e.Code == openai.CodeEngineTimeout || e.Code == CodeAdapterLoadFailed {
		return outcome{}, false
	}
	return outcome{code: e.Code, broke: e, begun: begun}, true
}

// finished learns the request's output length and its model's bytes per token, and counts whether it met its SLOs (goodput).
// The node that ran it counts it, with the time the request spent at its ingress included.
func (n *Node) finished(p *prepared, firstAt, end time.Time, u *engine.Usage) {
	n.adm.Observe(p.adm.Model, p.adm.Tenant, u.CompletionTokens)
	if p.req.Resume == nil { // a continuation's usage is the whole request's, not its prompt's
		n.learnTokens(p, u)
	}
	n.observeAgent(p, u)
	// The SLO clock: the arrival, or for an agent step held by its window, the moment the
	// window let it in (see admit.Request.SLOStart).
	ttft := firstAt.Sub(p.adm.SLOClock())
	var tpot time.Duration
	if u.CompletionTokens > 1 {
		tpot = end.Sub(firstAt) / time.Duration(u.CompletionTokens-1)
		n.m.tpot.Observe(tpot.Seconds())
	}
	ttftSLO, tpotSLO := n.adm.SLOFor(p.adm)
	class := admit.Class(p.adm.Priority)
	n.m.sloFinished.WithLabelValues(class).Inc()
	if (ttftSLO == 0 || ttft <= ttftSLO) && (tpotSLO == 0 || tpot <= tpotSLO) {
		n.m.sloMet.WithLabelValues(class).Inc()
	}
}

// stream relays chunks as server-sent events. An engine failure after the 200 ends the stream
// with an error event instead of [DONE], so the client knows the output is incomplete, unless
// the caller moves the request on (brokenRun).
func (n *Node) stream(ctx context.Context, w http.ResponseWriter, p *prepared, st engine.Stream, c engine.Chunk, enc *render.Encoder) (outcome, *engine.Usage) {
	sse := openai.NewSSEWriter(w)
	lp := render.NewLogprobs(p.endpoint)
	if rc := enc.RoleChunk(); rc != nil {
		if err := sse.WriteData(rc); err != nil {
			return outcome{code: openai.CodeClientClosed}, nil
		}
	}
	for {
		if c.Text != "" || c.FinishReason != "" || len(c.Logprobs) > 0 || len(c.ToolCalls) > 0 {
			if err := sse.WriteData(render.WithLogprobs(enc.Chunk(c), lp.Encode(c.Logprobs))); err != nil {
				return outcome{code: openai.CodeClientClosed}, nil
			}
		}
		if c.FinishReason != "" {
			if p.includeUsage {
				if err := sse.WriteData(enc.UsageChunk(c.Usage)); err != nil {
					return outcome{code: openai.CodeClientClosed}, nil
				}
			}
			if err := sse.WriteDone(); err != nil {
				return outcome{code: openai.CodeClientClosed}, nil
			}
			return outcome{completed: true}, c.Usage
		}
		var err error
		c, err = st.Recv()
		if err != nil {
			code := openai.CodeEngineError
			if e := n.drainCut(ctx); e != nil {
				_ = sse.WriteError(e)
				return outcome{code: e.Code}, nil
			}
			if ctx.Err() != nil {
				return outcome{code: openai.CodeClientClosed}, nil
			}
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			e := openai.NewError(http.StatusBadGateway, code, "generation failed mid-stream: "+err.Error())
			// An engine's own error event is its answer, passed on; its stream breaking is
			// its failure, which the caller may move on.
			if o, ok := brokenRun(ctx, p, e, true); ok && !errors.Is(err, external.ErrStream) {
				return o, nil
			}
			_ = sse.WriteError(e)
			return outcome{code: code}, nil
		}
	}
}

// collect gathers the whole generation into one JSON response.
func (n *Node) collect(ctx context.Context, w http.ResponseWriter, p *prepared, st engine.Stream, c engine.Chunk, enc *render.Encoder) (outcome, *engine.Usage) {
	var text strings.Builder
	var lps []engine.Logprob
	var calls render.CallJoiner
	for {
		text.WriteString(c.Text)
		lps = append(lps, c.Logprobs...)
		calls.Add(c.ToolCalls)
		if c.FinishReason != "" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			resp := render.WithLogprobs(enc.Complete(text.String(), c, calls.Calls()), render.NewLogprobs(p.endpoint).Encode(lps))
			_ = json.NewEncoder(w).Encode(resp)
			return outcome{completed: true}, c.Usage
		}
		var err error
		c, err = st.Recv()
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			e := cmp.Or(n.drainCut(ctx), openai.NewError(http.StatusBadGateway, openai.CodeEngineError, "generation failed: "+err.Error()))
			if o, ok := brokenRun(ctx, p, e, false); ok {
				return o, nil // nothing was written: the whole response can run again
			}
			writeRefusal(w, e, 0)
			return outcome{code: e.Code}, nil
		}
	}
}
