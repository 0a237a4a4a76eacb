package journey

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

// ServeLocal runs p on this node's engine and writes the OpenAI response to w. Nothing is
// written until the first token exists, so an engine failure before it is still a clean 502
// (and, for a forwarded request, lets the ingress try another peer). When p.moveBreak, an
// engine failure, before the first token or mid-response, is left unwritten (outcome.broke)
// for the caller to move the request elsewhere.
func (x *Executor) ServeLocal(ctx context.Context, w http.ResponseWriter, p *Request, start time.Time, origin string) Outcome {
	x.m.Served.WithLabelValues(origin).Inc()
	native := x.nativeRun(p)
	st, err := x.Generate(ctx, p)
	if err != nil {
		// The engine said no before any output: a 4xx is a refusal (the client's request), the
		// rest a failure (the engine's).
		e := cmp.Or(x.DrainCut(ctx), EngineError(err))
		if o, ok := BrokenRun(ctx, p, e, false); ok {
			return o
		}
		WriteRefusal(w, e, 0)
		return Outcome{Code: e.Code, Refused: e.Status < 500}
	}
	defer st.Close()
	first, err := st.Recv()
	if err != nil {
		e := EngineError(err)
		if ctx.Err() != nil {
			e = cmp.Or(x.DrainCut(ctx), openai.NewError(499, openai.CodeClientClosed, "client closed the request"))
		}
		if o, ok := BrokenRun(ctx, p, e, false); ok {
			return o
		}
		WriteRefusal(w, e, 0)
		return Outcome{Code: e.Code}
	}
	firstAt := time.Now()
	if origin == "local" && p.Origin == nil { // a continuation's first token is not the request's
		x.m.TTFT.Observe(firstAt.Sub(start).Seconds())
	}
	x.inFlightTokens.Add(int64(p.Req.MaxTokens))
	defer x.inFlightTokens.Add(-int64(p.Req.MaxTokens))
	w.Header().Set(HeaderNode, x.cfg.Name)
	enc := render.New(p.Endpoint, p.Req.ID, p.Model.Name, p.IncludeUsage, firstAt)
	var o Outcome
	var u *engine.Usage
	switch {
	case native:
		o, u = x.answerNative(ctx, w, p, st, first)
	case p.Stream:
		o, u = x.stream(ctx, w, p, st, first, enc)
	default:
		o, u = x.collect(ctx, w, p, st, first, enc)
	}
	if o.Completed && u != nil {
		x.finished(p, firstAt, time.Now(), u)
	}
	return o
}

// BrokenRun is the outcome of a run of p whose engine failed with e, before the client's
// response began or after (begun), when its caller moves such a request elsewhere
// (p.moveBreak): ok false when it does not, or when e is not the engine's failure but the
// client's leaving, this node's drain, the request itself (4xx) or a first token later than
// its deadline, which no other engine would beat. The engine's own overload (429) before the
// response began is moved on too: another node's engine may have room.
func BrokenRun(ctx context.Context, p *Request, e *openai.Error, begun bool) (o Outcome, ok bool) {
	busy := e.Status == http.StatusTooManyRequests && !begun
	if !p.MoveBreak || ctx.Err() != nil || (e.Status < 500 && !busy) || e.Code == openai.CodeEngineTimeout || e.Code == CodeAdapterLoadFailed {
		return Outcome{}, false
	}
	return Outcome{Code: e.Code, Broke: e, Begun: begun}, true
}

// finished learns the request's output length and its model's bytes per token, and counts
// whether it met its SLOs (goodput). The node that ran it counts it, with the time the
// request spent at its ingress included.
func (x *Executor) finished(p *Request, firstAt, end time.Time, u *engine.Usage) {
	x.adm.Observe(p.Adm.Model, p.Adm.Tenant, u.CompletionTokens)
	if p.Req.Resume == nil { // a continuation's usage is the whole request's, not its prompt's
		x.learnTokens(p, u)
	}
	x.ObserveAgent(p, u)
	// The SLO clock: the arrival, or for an agent step held by its window, the moment the
	// window let it in (see admit.Request.SLOStart).
	ttft := firstAt.Sub(p.Adm.SLOClock())
	var tpot time.Duration
	if u.CompletionTokens > 1 {
		tpot = end.Sub(firstAt) / time.Duration(u.CompletionTokens-1)
		x.m.TPOT.Observe(tpot.Seconds())
	}
	ttftSLO, tpotSLO := x.adm.SLOFor(p.Adm)
	class := admit.Class(p.Adm.Priority)
	x.m.SLOFinished.WithLabelValues(class).Inc()
	if (ttftSLO == 0 || ttft <= ttftSLO) && (tpotSLO == 0 || tpot <= tpotSLO) {
		x.m.SLOMet.WithLabelValues(class).Inc()
	}
}

// stream relays chunks as server-sent events. An engine failure after the 200 ends the stream
// with an error event instead of [DONE], so the client knows the output is incomplete, unless
// the caller moves the request on (BrokenRun).
func (x *Executor) stream(ctx context.Context, w http.ResponseWriter, p *Request, st engine.Stream, c engine.Chunk, enc *render.Encoder) (Outcome, *engine.Usage) {
	sse := openai.NewSSEWriter(w)
	lp := render.NewLogprobs(p.Endpoint)
	if rc := enc.RoleChunk(); rc != nil {
		if err := sse.WriteData(rc); err != nil {
			return Outcome{Code: openai.CodeClientClosed}, nil
		}
	}
	for {
		if c.Text != "" || c.FinishReason != "" || len(c.Logprobs) > 0 || len(c.ToolCalls) > 0 {
			if err := sse.WriteData(render.WithLogprobs(enc.Chunk(c), lp.Encode(c.Logprobs))); err != nil {
				return Outcome{Code: openai.CodeClientClosed}, nil
			}
		}
		if c.FinishReason != "" {
			if p.IncludeUsage {
				if err := sse.WriteData(enc.UsageChunk(c.Usage)); err != nil {
					return Outcome{Code: openai.CodeClientClosed}, nil
				}
			}
			if err := sse.WriteDone(); err != nil {
				return Outcome{Code: openai.CodeClientClosed}, nil
			}
			return Outcome{Completed: true}, c.Usage
		}
		var err error
		c, err = st.Recv()
		if err != nil {
			code := openai.CodeEngineError
			if e := x.DrainCut(ctx); e != nil {
				_ = sse.WriteError(e)
				return Outcome{Code: e.Code}, nil
			}
			if ctx.Err() != nil {
				return Outcome{Code: openai.CodeClientClosed}, nil
			}
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			e := openai.NewError(http.StatusBadGateway, code, "generation failed mid-stream: "+err.Error())
			// An engine's own error event is its answer, passed on; its stream breaking is
			// its failure, which the caller may move on.
			if o, ok := BrokenRun(ctx, p, e, true); ok && !errors.Is(err, external.ErrStream) {
				return o, nil
			}
			_ = sse.WriteError(e)
			return Outcome{Code: code}, nil
		}
	}
}

// collect gathers the whole generation into one JSON response.
func (x *Executor) collect(ctx context.Context, w http.ResponseWriter, p *Request, st engine.Stream, c engine.Chunk, enc *render.Encoder) (Outcome, *engine.Usage) {
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
			resp := render.WithLogprobs(enc.Complete(text.String(), c, calls.Calls()), render.NewLogprobs(p.Endpoint).Encode(lps))
			_ = json.NewEncoder(w).Encode(resp)
			return Outcome{Completed: true}, c.Usage
		}
		var err error
		c, err = st.Recv()
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			e := cmp.Or(x.DrainCut(ctx), openai.NewError(http.StatusBadGateway, openai.CodeEngineError, "generation failed: "+err.Error()))
			if o, ok := BrokenRun(ctx, p, e, false); ok {
				return o, nil // nothing was written: the whole response can run again
			}
			WriteRefusal(w, e, 0)
			return Outcome{Code: e.Code}, nil
		}
	}
}

// learnTokens learns model's bytes per token from a request this node's engine finished: the
// rendered prompt's bytes against the engine's usage.prompt_tokens. Only an external engine
// teaches it: the embedded one counts prompts with kvmesh's own 4-byte rule. A request relayed
// from a peer teaches the ingress nothing (the relay copies bytes and reads no usage); the
// owner that ran it learns, and its own re-check counts the prompt with what it learned. A
// prompt with images or audio teaches nothing: the engine's count holds what its encoders
// spent on them, which kvmesh only estimates, and would skew the text's figure.
func (x *Executor) learnTokens(p *Request, u *engine.Usage) {
	if !x.cfg.LearnTokens || u.PromptTokens <= 0 || p.PartTokens > 0 {
		return
	}
	if f, ok := x.tokens.Learn(p.Adm.Model, len(p.Req.Prompt), u.PromptTokens); ok {
		x.m.BytesPerToken.WithLabelValues(p.Adm.Model).Set(f)
	}
}
