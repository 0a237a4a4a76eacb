package journey

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvmesh/kvmesh/node/attempt"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/metrics"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/relay"
	"github.com/kvmesh/kvmesh/node/transport"
)

// Migration. When the owner of a forwarded request fails mid-response (its QUIC stream breaks
// after the response began, or it closes a stream between two events) while the client is
// still connected, the ingress does not give the request up: it sends the rest of it through
// admission and routing again, with the failed owners excluded, as a continuation. For a
// stream, the continuation's prompt is the original's followed by the text the client has
// already been sent (for chat, as a final assistant message to continue, not a new turn),
// its max_tokens what is left, and its header a transport.Resume that lets the owner's
// engine carry on exactly where the client's stream stopped (the embedded engine sends the
// very text an unbroken run would have); its events join the client's stream, its opening
// role chunk dropped, so the client reads one stream with one finish_reason and the usage of
// the whole request. A response the client did not ask to stream is sent only once complete
// (RelayWhole), so it is simply run again: an owner answers one only when its text is done, so
// one that dies while generating it fails the forward before any answer, and the request runs
// on its next candidate as after any failed attempt (dispatch and the retry budget); migrate
// sees one only when the owner fails between the first and the last byte of its answer.
// A stream that has sent the client a piece of a tool call does not move: a continuation
// continues text, and no engine can be told to go on from half of a call's arguments, so the
// stream ends with an error event (kvmesh_migrations_total{outcome="refused"}) and the client
// asks again. Text sent before a tool call is continued as any text is, and the continuation
// may call the tool. Config.Migrations bounds the moves of one request; past it, or when no node takes the
// continuation, the response ends with an explicit error. kvmesh_migrations_total counts each
// move by outcome and cause.
//
// An engine that fails mid-response under a live node moves the request the same way, by the
// same rules, from the ingress, which alone holds what the client was sent and the request's
// count of moves (a forward is one hop: an owner forwards nothing on). When the engine is this
// node's, the attempt reports the break (attempt.Broke) and the planner's Migrate step lands
// here; when it is an owner's, the owner ends its stream with the engine's failure
// (transport.ResponseWriter.Fail) instead of an error event, and the relay of its answer
// migrates as for an owner that died. Before the client's response began, an engine's failure
// is a failed attempt (the next candidate runs the request), wherever the engine is.

// errEngineFailed wraps the failure of this node's engine mid-response, a migration's cause.
var errEngineFailed = errors.New("its engine failed")

// causeOf is the cause label of err, what ended an owner's response: an owner reports its
// engine's failure in its stream's end (transport.ErrRemote).
func causeOf(err error) string {
	if errors.Is(err, errEngineFailed) || errors.Is(err, transport.ErrRemote) {
		return metrics.CauseEngine
	}
	return metrics.CauseOwner
}

// Migrate answers for p, whose owner failed (cause) before its response to the client ended:
// it moves the rest of the request to another node when it may, or ends the client's
// response with an error. w is the client's writer: a *relay.Stream for a stream.
func (x *Executor) Migrate(ctx context.Context, w http.ResponseWriter, p *Request, owner string, cause error) Outcome {
	cs, _ := w.(*relay.Stream)
	if e := x.DrainCut(ctx); e != nil {
		// This node's drain timeout, not the owner, ended the relay.
		if cs != nil {
			cs.End(e)
		} else {
			WriteRefusal(w, e, 0)
		}
		return Outcome{Code: e.Code}
	}
	o := p
	if p.Origin != nil {
		o = p.Origin
	}
	step := attempt.Move(ctx.Err() != nil, o.Migrations, x.cfg.Migrations)
	if step.Kind == attempt.Gone {
		return Outcome{Code: openai.CodeClientClosed} // the client left: no one to answer
	}
	why := causeOf(cause)
	fail := func(code string) Outcome {
		msg := fmt.Sprintf("node %s failed mid-response: %v", owner, cause)
		if cs == nil {
			e := openai.NewError(http.StatusBadGateway, openai.CodeEngineError, msg)
			WriteRefusal(w, e, 0)
			return Outcome{Code: e.Code}
		}
		if code != "" {
			msg += "; its continuation on another node ended with " + code
		}
		cs.End(openai.NewError(http.StatusBadGateway, openai.CodeEngineError, msg))
		return Outcome{Code: openai.CodeEngineError}
	}
	var next *Request
	stuck := "the request moved as often as --migrations allows"
	if step.Kind == attempt.Migrate {
		next, stuck = x.continuation(o, cs)
	}
	if stuck != "" {
		x.m.Migrated.WithLabelValues(metrics.MigrationRefused, why).Inc()
		x.log.Warn("owner failed mid-response; the request cannot move", "id", p.Req.ID, "owner", owner, "cause", why,
			"err", cause, "why", stuck)
		return fail("")
	}
	o.Migrations++
	k := o.Migrations
	next.Exclude = append(slices.Clone(p.Exclude), owner)
	sent := 0
	if cs != nil {
		sent = cs.Tokens()
		cs.Resume()
	} else {
		// Nothing was sent: the request runs again from the start, and names a prefill node
		// only if it is split again.
		w.Header().Del(HeaderPrefillNode)
	}
	x.log.Warn("owner failed mid-response; the request moves", "id", p.Req.ID, "owner", owner, "cause", why, "err", cause,
		"migration", k, "sent_chunks", sent)
	res := x.AdmitAndDispatch(ctx, w, next, next.Adm.Arrived, false)
	if res.Code == openai.CodeClientClosed && !res.Completed {
		// The client left while the request moved (a departure this node learns only at its
		// next write): uncounted, as a move never begun for a departed client.
		return Outcome{Code: res.Code}
	}
	label := metrics.MigrationFailed
	switch {
	case res.Completed && o.Migrations == k:
		label = metrics.MigrationCompleted
	case res.Refused && o.Migrations == k:
		label = metrics.MigrationRefused
	}
	x.m.Migrated.WithLabelValues(label, why).Inc()
	switch {
	case res.Completed || cs == nil:
		return res // a whole response's refusal or failure went to the client as it is
	case cs.Ended():
		return Outcome{Code: openai.CodeEngineError}
	}
	return fail(res.Code)
}

// continuation builds the request that continues o, the client's, after what cs has sent
// (cs nil: a whole response, of which nothing was sent: o again). why, when not "", says why
// o cannot continue.
func (x *Executor) continuation(o *Request, cs *relay.Stream) (next *Request, why string) {
	body := o.Req.Body
	var resume *engine.Resume
	if cs != nil {
		left := o.Req.MaxTokens - cs.Tokens()
		switch {
		case o.Req.Echo:
			return nil, "the prompt is echoed"
		case cs.ToolCalls():
			return nil, "a tool call was sent"
		case len(o.Req.Roles) > 0 && o.Req.Roles[len(o.Req.Roles)-1] == "assistant":
			return nil, "the client's last message is the assistant's"
		case left < 1:
			return nil, "no tokens left"
		}
		var err error
		if body, err = continuationBody(o, cs.Text(), left); err != nil {
			return nil, err.Error()
		}
		resume = &engine.Resume{Seed: o.Req.Seed, PromptHash: xxhash.Sum64(o.Req.Prompt), Tokens: cs.Tokens(),
			Bytes: len(cs.Text()), PromptTokens: o.Req.PromptTokens}
	}
	next, oerr := x.host.Prepare(o.Endpoint, o.Req.ID, body)
	if oerr != nil {
		return nil, oerr.Message
	}
	if cs == nil {
		next.Native = o.Native // run again whole: as the client sent it, where an engine takes that
	}
	a := &next.Adm
	a.Priority, a.Tenant, a.TTFTSLO, a.TPOTSLO, a.QueueTTL = o.Adm.Priority, o.Adm.Tenant, o.Adm.TTFTSLO, o.Adm.TPOTSLO, o.Adm.QueueTTL
	a.Arrived = time.Now() // admitted afresh; it runs outside any agent window
	next.Req.Priority, next.Req.Resume, next.Origin = a.Priority, resume, o
	return next, ""
}

// continuationBody is o's body continued after text, with left tokens to go: for chat, its
// messages end with an assistant message holding text; for completions, its prompt ends with
// text. The keys' order is not kept (the engine that runs it receives this body).
func continuationBody(o *Request, text string, left int) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(o.Req.Body, &m); err != nil {
		return nil, err
	}
	set := func(key string, v any) {
		m[key], _ = json.Marshal(v)
	}
	if o.Endpoint == engine.Completion {
		set("prompt", string(o.Req.Prompt)+text)
		set("max_tokens", left)
		return json.Marshal(m)
	}
	var msgs []json.RawMessage
	if err := json.Unmarshal(m["messages"], &msgs); err != nil {
		return nil, err
	}
	last, _ := json.Marshal(map[string]string{"role": "assistant", "content": text})
	set("messages", append(msgs, last))
	_, mct := m["max_completion_tokens"]
	if mct {
		set("max_completion_tokens", left)
	}
	if _, mt := m["max_tokens"]; mt || !mct {
		set("max_tokens", left)
	}
	return json.Marshal(m)
}

// ResumeHeader and resumeOf carry engine.Resume over the wire as transport.Resume.
func ResumeHeader(r *engine.Resume) *transport.Resume {
	if r == nil {
		return nil
	}
	return &transport.Resume{Seed: r.Seed, PromptHash: r.PromptHash, Tokens: r.Tokens, Bytes: r.Bytes, PromptTokens: r.PromptTokens}
}

func ResumeOf(r *transport.Resume) *engine.Resume {
	if r == nil {
		return nil
	}
	return &engine.Resume{Seed: r.Seed, PromptHash: r.PromptHash, Tokens: r.Tokens, Bytes: r.Bytes, PromptTokens: r.PromptTokens}
}
