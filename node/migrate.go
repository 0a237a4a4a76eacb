package node

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/openai"
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
// (relayWhole), so it is simply run again: an owner answers one only when its text is done, so
// one that dies while generating it fails the forward before any answer, and the request runs
// on its next candidate as after any failed attempt (dispatch and the retry budget); migrate
// sees one only when the owner fails between the first and the last byte of its answer.
// Config.Migrations bounds the moves of one request; past it, or when no node takes the
// continuation, the response ends with an explicit error as before. kvmesh_migrations_total
// counts each move by outcome.

// The outcomes of a migration, the values of kvmesh_migrations_total's label.
const (
	migrationCompleted = "completed" // the continuation ran to its end
	migrationFailed    = "failed"    // the continuation began but did not end: an error, or its owner failed too
	migrationRefused   = "refused"   // not moved: past the limit, not continuable, or no node took it
)

// migrate answers for p, whose owner failed (cause) before its response to the client ended:
// it moves the rest of the request to another node when it may, or ends the client's
// response with an error. w is the client's writer: a *clientStream for a stream.
func (n *Node) migrate(ctx context.Context, w http.ResponseWriter, p *prepared, owner string, cause error) outcome {
	cs, _ := w.(*clientStream)
	if e := n.drainCut(ctx); e != nil {
		// This node's drain timeout, not the owner, ended the relay.
		if cs != nil {
			cs.end(e)
		} else {
			writeRefusal(w, e, 0)
		}
		return outcome{code: e.Code}
	}
	if ctx.Err() != nil {
		return outcome{code: openai.CodeClientClosed} // the client left: no one to answer
	}
	o := p
	if p.origin != nil {
		o = p.origin
	}
	fail := func(code string) outcome {
		if cs == nil {
			e := openai.NewError(http.StatusBadGateway, openai.CodeEngineError, "the owner node failed mid-response: "+cause.Error())
			writeRefusal(w, e, 0)
			return outcome{code: e.Code}
		}
		msg := "the owner node failed mid-response: " + cause.Error()
		if code != "" {
			msg += "; its continuation on another node ended with " + code
		}
		cs.end(openai.NewError(http.StatusBadGateway, openai.CodeEngineError, msg))
		return outcome{code: openai.CodeEngineError}
	}
	var next *prepared
	why := "the request moved as often as --migrations allows"
	if o.migrations < n.cfg.Migrations {
		next, why = n.continuation(o, cs)
	}
	if why != "" {
		n.m.migrated.WithLabelValues(migrationRefused).Inc()
		n.log.Warn("owner failed mid-response; the request cannot move", "id", p.req.ID, "owner", owner, "err", cause, "why", why)
		return fail("")
	}
	o.migrations++
	k := o.migrations
	next.exclude = append(slices.Clone(p.exclude), owner)
	sent := 0
	if cs != nil {
		sent = cs.tokens
		cs.resume()
	} else {
		// Nothing was sent: the request runs again from the start, and names a prefill node
		// only if it is split again.
		w.Header().Del(HeaderPrefillNode)
	}
	n.log.Warn("owner failed mid-response; the request moves", "id", p.req.ID, "owner", owner, "err", cause,
		"migration", k, "sent_chunks", sent)
	res := n.admitAndDispatch(ctx, w, next, next.adm.Arrived, false)
	label := migrationFailed
	switch {
	case res.completed && o.migrations == k:
		label = migrationCompleted
	case res.refused && o.migrations == k:
		label = migrationRefused
	}
	n.m.migrated.WithLabelValues(label).Inc()
	switch {
	case res.completed || cs == nil:
		return res // a whole response's refusal or failure went to the client as it is
	case res.code == openai.CodeClientClosed:
		return outcome{code: res.code}
	case cs.ended():
		return outcome{code: openai.CodeEngineError}
	}
	return fail(res.code)
}

// continuation builds the request that continues o, the client's, after what cs has sent
// (cs nil: a whole response, of which nothing was sent: o again). why, when not "", says why
// o cannot continue.
func (n *Node) continuation(o *prepared, cs *clientStream) (next *prepared, why string) {
	body := o.req.Body
	var resume *engine.Resume
	if cs != nil {
		left := o.req.MaxTokens - cs.tokens
		switch {
		case o.req.Echo:
			return nil, "the prompt is echoed"
		case len(o.req.Roles) > 0 && o.req.Roles[len(o.req.Roles)-1] == "assistant":
			return nil, "the client's last message is the assistant's"
		case left < 1:
			return nil, "no tokens left"
		}
		var err error
		if body, err = continuationBody(o, cs.text.String(), left); err != nil {
			return nil, err.Error()
		}
		resume = &engine.Resume{Seed: o.req.Seed, PromptHash: xxhash.Sum64(o.req.Prompt), Tokens: cs.tokens,
			Bytes: cs.text.Len(), PromptTokens: o.req.PromptTokens}
	}
	next, oerr := n.prepare(o.endpoint, o.req.ID, body)
	if oerr != nil {
		return nil, oerr.Message
	}
	a := &next.adm
	a.Priority, a.Tenant, a.TTFTSLO, a.TPOTSLO, a.QueueTTL = o.adm.Priority, o.adm.Tenant, o.adm.TTFTSLO, o.adm.TPOTSLO, o.adm.QueueTTL
	a.Arrived = time.Now() // admitted afresh; it runs outside any agent window
	next.req.Priority, next.req.Resume, next.origin = a.Priority, resume, o
	return next, ""
}

// continuationBody is o's body continued after text, with left tokens to go: for chat, its
// messages end with an assistant message holding text; for completions, its prompt ends with
// text. The keys' order is not kept (the engine that runs it receives this body).
func continuationBody(o *prepared, text string, left int) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(o.req.Body, &m); err != nil {
		return nil, err
	}
	set := func(key string, v any) {
		m[key], _ = json.Marshal(v)
	}
	if o.endpoint == engine.Completion {
		set("prompt", string(o.req.Prompt)+text)
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

// resumeHeader and resumeOf carry engine.Resume over the wire as transport.Resume.
func resumeHeader(r *engine.Resume) *transport.Resume {
	if r == nil {
		return nil
	}
	return &transport.Resume{Seed: r.Seed, PromptHash: r.PromptHash, Tokens: r.Tokens, Bytes: r.Bytes, PromptTokens: r.PromptTokens}
}

func resumeOf(r *transport.Resume) *engine.Resume {
	if r == nil {
		return nil
	}
	return &engine.Resume{Seed: r.Seed, PromptHash: r.PromptHash, Tokens: r.Tokens, Bytes: r.Bytes, PromptTokens: r.PromptTokens}
}

// clientStream is the client's side of a relayed stream. It passes the owner's events on
// whole, as each completes, and keeps what the client was sent: the text, how many chunks
// carried it, and whether the stream ended ([DONE] or an error event). After resume the
// events of a continuation pass through it too, into the same response, its opening role
// chunk dropped and its status and headers kept from the client, so the client reads one
// stream. It implements http.ResponseWriter and http.Flusher for the code that writes a
// continuation (relay, or this node's own serveLocal). One goroutine uses it at a time.
type clientStream struct {
	w     http.ResponseWriter
	rc    *http.ResponseController
	chat  bool
	track bool // parse events for their text (migration is on)

	cont    bool        // the events come from a continuation
	status  int         // the current source's status; 0 until it writes
	scratch http.Header // a continuation's headers, which the client never sees
	pending []byte      // the current source's event in progress

	text   strings.Builder // the text sent
	tokens int             // the chunks that carried it
	done   bool            // [DONE] sent
	failed bool            // an error event sent
}

var (
	_ http.ResponseWriter = (*clientStream)(nil)
	_ http.Flusher        = (*clientStream)(nil)
)

func newClientStream(w http.ResponseWriter, ep engine.Endpoint, track bool) *clientStream {
	return &clientStream{w: w, rc: http.NewResponseController(w), chat: ep == engine.Chat, track: track}
}

// resume makes the next events a continuation's.
func (s *clientStream) resume() {
	s.cont, s.status, s.scratch, s.pending = true, 0, http.Header{}, nil
}

func (s *clientStream) ended() bool { return s.done || s.failed }

// outcome is the request's outcome once the client's stream ended: completed at [DONE], failed
// after an error event.
func (s *clientStream) outcome() (outcome, bool) {
	switch {
	case s.done:
		return outcome{completed: true}, true
	case s.failed:
		return outcome{code: openai.CodeEngineError}, true
	}
	return outcome{}, false
}

// end ends the client's stream with e.
func (s *clientStream) end(e *openai.Error) {
	s.failed = true
	_ = openai.NewSSEWriter(s.w).WriteError(e)
}

func (s *clientStream) Header() http.Header {
	if s.cont {
		return s.scratch
	}
	return s.w.Header()
}

func (s *clientStream) WriteHeader(status int) {
	if s.status != 0 {
		return
	}
	s.status = status
	if !s.cont {
		s.w.WriteHeader(status)
	}
}

// Write takes the source's bytes: its events go to the client as each completes. A
// continuation that answers other than 200 (it failed before its first token) sends the
// client nothing.
func (s *clientStream) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.WriteHeader(http.StatusOK)
	}
	if s.status != http.StatusOK {
		if s.cont {
			return len(b), nil
		}
		return s.w.Write(b)
	}
	s.pending = append(s.pending, b...)
	rest, wrote := s.pending, false
	for {
		i := bytes.Index(rest, []byte("\n\n"))
		if i < 0 {
			break
		}
		if s.keep(rest[:i]) {
			if _, err := s.w.Write(rest[:i+2]); err != nil {
				return 0, err
			}
			wrote = true
		}
		rest = rest[i+2:]
	}
	s.pending = append(s.pending[:0], rest...) // the event in progress, at the front
	if wrote {
		s.Flush()
	}
	return len(b), nil
}

// Flush sends what was written to the client.
func (s *clientStream) Flush() { _ = s.rc.Flush() }

// keep records the event ev (without its blank line) as sent and reports whether it goes to
// the client: all do but a continuation's opening role chunk.
func (s *clientStream) keep(ev []byte) bool {
	data, ok := bytes.CutPrefix(ev, []byte("data: "))
	switch {
	case !ok:
		return true
	case bytes.Equal(data, []byte("[DONE]")):
		s.done = true
		return true
	case bytes.HasPrefix(data, []byte(`{"error"`)):
		s.failed = true
		return true
	case !s.track:
		return true
	}
	var c struct {
		Choices []struct {
			Delta struct {
				Role    string  `json:"role"`
				Content *string `json:"content"`
			} `json:"delta"`
			Text         *string `json:"text"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
	}
	if json.Unmarshal(data, &c) != nil || len(c.Choices) == 0 {
		return true // the usage chunk
	}
	ch := c.Choices[0]
	text := ch.Text
	if s.chat {
		text = ch.Delta.Content
	}
	if s.cont && s.chat && ch.Delta.Role != "" && (text == nil || *text == "") && ch.FinishReason == nil {
		return false // the client's stream opened with its own
	}
	if text != nil && *text != "" {
		s.text.WriteString(*text)
		s.tokens++
	}
	return true
}
