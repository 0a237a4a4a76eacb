package relay

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/kvmesh/kvmesh/node/openai"
)

// Stream is the client's side of a relayed stream. It passes the owner's events on
// whole, as each completes, and keeps what the client was sent: the text, how many chunks
// carried it, and whether the stream ended ([DONE] or an error event). After Resume the
// events of a continuation pass through it too, into the same response, its opening role
// chunk dropped and its status and headers kept from the client, so the client reads one
// stream. It implements http.ResponseWriter and http.Flusher for the code that writes a
// continuation. One goroutine uses it at a time.
type Stream struct {
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
	calls  bool            // a piece of a tool call sent
	done   bool            // [DONE] sent
	failed bool            // an error event sent
}

var (
	_ http.ResponseWriter = (*Stream)(nil)
	_ http.Flusher        = (*Stream)(nil)
)

// New is the client's stream over w, for chat chunks (else completions'); track parses the
// events for their text, which a continuation needs.
func New(w http.ResponseWriter, chat, track bool) *Stream {
	return &Stream{w: w, rc: http.NewResponseController(w), chat: chat, track: track}
}

// Client is the client's writer, for an answer that does not pass through the stream (a
// native Messages answer, which never moves).
func (s *Stream) Client() http.ResponseWriter { return s.w }

// Resume makes the next events a continuation's.
func (s *Stream) Resume() {
	s.cont, s.status, s.scratch, s.pending = true, 0, http.Header{}, nil
}

// Ended reports whether the client's stream ended: Done or Failed.
func (s *Stream) Ended() bool { return s.done || s.failed }

// Done reports whether [DONE] was sent.
func (s *Stream) Done() bool { return s.done }

// Failed reports whether an error event was sent.
func (s *Stream) Failed() bool { return s.failed }

// Tokens is how many chunks carried text to the client.
func (s *Stream) Tokens() int { return s.tokens }

// Text is the text sent to the client.
func (s *Stream) Text() string { return s.text.String() }

// ToolCalls reports whether a piece of a tool call was sent to the client (tracked streams
// only): such a stream has no text to continue from.
func (s *Stream) ToolCalls() bool { return s.calls }

// End ends the client's stream with e.
func (s *Stream) End(e *openai.Error) {
	s.failed = true
	_ = openai.NewSSEWriter(s.w).WriteError(e)
}

func (s *Stream) Header() http.Header {
	if s.cont {
		return s.scratch
	}
	return s.w.Header()
}

func (s *Stream) WriteHeader(status int) {
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
func (s *Stream) Write(b []byte) (int, error) {
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
func (s *Stream) Flush() { _ = s.rc.Flush() }

// keep records the event ev (without its blank line) as sent and reports whether it goes to
// the client: all do but a continuation's opening role chunk.
func (s *Stream) keep(ev []byte) bool {
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
				Role      string          `json:"role"`
				Content   *string         `json:"content"`
				ToolCalls json.RawMessage `json:"tool_calls"`
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
	if t := ch.Delta.ToolCalls; len(t) > 0 && string(t) != "null" && string(t) != "[]" {
		s.calls = true
	}
	return true
}

// ErrClientGone is Pipe's error when the client's side could not be written.
var ErrClientGone = errors.New("relay: the client's stream could not be written")

// Pipe copies an owner's event stream from body into s until the client's stream ends: nil
// when it did ([DONE] or an error event: Done, Failed), ErrClientGone when the client could
// not be written, else the owner's failure, io.ErrUnexpectedEOF when its side closed between
// two events without ending the stream. first, when not nil, is called once, at the first
// bytes.
func (s *Stream) Pipe(body io.Reader, first func()) error {
	buf := make([]byte, 32<<10)
	for {
		nr, err := body.Read(buf)
		if nr > 0 {
			if first != nil {
				first()
				first = nil
			}
			if _, werr := s.Write(buf[:nr]); werr != nil {
				return ErrClientGone
			}
		}
		if err == io.EOF {
			if s.Ended() {
				return nil
			}
			err = io.ErrUnexpectedEOF // the owner's side went away between two events: the output is cut short
		}
		if err != nil {
			return err
		}
	}
}
