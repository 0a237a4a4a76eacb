package anthropic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// ResponseWriter stands between the chat completions handler and a Messages client: it takes
// what the handler writes (a chat completion, an OpenAI error, or a chat stream) and sends the
// Messages API's answer instead. A JSON answer is held until Finish; a stream (a 200 of
// Content-Type text/event-stream) is translated event by event as it is written, and flushed
// after each write. Headers the handler sets (X-Kvmesh-*, Retry-After) pass through.
type ResponseWriter struct {
	w      http.ResponseWriter
	rc     *http.ResponseController
	stops  []string
	input  int
	status int
	stream *streamer
	line   []byte // a stream's incomplete line
	buf    bytes.Buffer
	err    error
	passed bool // Passthrough: the handler writes the client's answer itself
}

var (
	_ http.ResponseWriter = (*ResponseWriter)(nil)
	_ http.Flusher        = (*ResponseWriter)(nil)
)

// NewResponseWriter translates what is written to it for w.
func NewResponseWriter(w http.ResponseWriter) *ResponseWriter {
	return &ResponseWriter{w: w, rc: http.NewResponseController(w)}
}

// SetStopSequences names the request's stop sequences, before anything is written: the answer
// reports the one that ended it (stop_reason stop_sequence) and leaves it out of the text.
func (rw *ResponseWriter) SetStopSequences(stops []string) { rw.stops = stops }

// SetInputTokens names the prompt tokens the ingress counted for the request, before anything
// is written: a stream's message_start reports them as its usage.input_tokens, since the
// engine's count is not known until the end (message_delta's usage has the engine's).
func (rw *ResponseWriter) SetInputTokens(n int) { rw.input = n }

// Header is the client's response header.
func (rw *ResponseWriter) Header() http.Header { return rw.w.Header() }

// WriteHeader records the status; the client's goes out with the translated answer.
func (rw *ResponseWriter) WriteHeader(status int) {
	if rw.status == 0 && status >= 200 {
		rw.status = status
	}
}

// Write takes the handler's body.
func (rw *ResponseWriter) Write(b []byte) (int, error) {
	if rw.status == 0 {
		rw.status = http.StatusOK
	}
	if rw.stream == nil && rw.status == http.StatusOK && strings.HasPrefix(rw.w.Header().Get("Content-Type"), eventStreamMedia) {
		rw.stream = newStreamer(rw.emit, rw.stops)
		rw.stream.input = rw.input
		rw.w.WriteHeader(http.StatusOK)
	}
	if rw.stream == nil {
		return rw.buf.Write(b)
	}
	if rw.err != nil {
		return 0, rw.err
	}
	rw.line = append(rw.line, b...)
	for {
		i := bytes.IndexByte(rw.line, '\n')
		if i < 0 {
			break
		}
		l := bytes.TrimRight(rw.line[:i], "\r")
		if d, ok := bytes.CutPrefix(l, []byte("data:")); ok {
			if err := rw.stream.data(d); err != nil {
				rw.err = err
				return 0, err
			}
		}
		rw.line = rw.line[i+1:]
	}
	rw.Flush()
	return len(b), nil
}

// emit writes one Messages event.
func (rw *ResponseWriter) emit(event string, data any) error {
	b, err := json.Marshal(data)
	if err != nil {
		return fmt.Errorf("anthropic: encoding %s: %w", event, err)
	}
	out := make([]byte, 0, len(event)+len(b)+16)
	out = append(append(append(out, "event: "...), event...), "\ndata: "...)
	out = append(append(out, b...), '\n', '\n')
	_, err = rw.w.Write(out)
	return err
}

// Flush sends a stream's events so far; a JSON answer waits for Finish.
func (rw *ResponseWriter) Flush() { _ = rw.FlushError() }

// FlushError is Flush, for http.ResponseController.
func (rw *ResponseWriter) FlushError() error {
	if rw.stream == nil {
		return nil
	}
	return rw.rc.Flush()
}

// Unwrap is the client's writer, for http.ResponseController's deadlines.
func (rw *ResponseWriter) Unwrap() http.ResponseWriter { return rw.w }

// Passthrough hands the client's writer to a handler whose answer is already in the Messages
// API's shape (an engine that serves the API natively): what it writes there reaches the
// client as it is, Wrote reports true and Finish sends nothing. Headers set before, on either
// writer, are the same.
func (rw *ResponseWriter) Passthrough() http.ResponseWriter {
	rw.passed = true
	if rw.status == 0 {
		rw.status = http.StatusOK
	}
	return rw.w
}

// Wrote reports whether the handler wrote anything.
func (rw *ResponseWriter) Wrote() bool { return rw.status != 0 }

// Finish sends a JSON answer: the Messages answer of a chat completion, or the Messages error
// of an error (ErrorOf). A stream was sent as it came, and needs nothing more.
func (rw *ResponseWriter) Finish() {
	if rw.stream != nil || rw.status == 0 || rw.passed {
		return
	}
	h := rw.w.Header()
	h.Del("Content-Length")
	h.Set("Content-Type", "application/json")
	status, body := rw.status, rw.buf.Bytes()
	var v any
	if status >= 400 {
		status, v = translateError(status, body)
	} else if r, err := FromChat(body, rw.stops); err == nil {
		v = r
	} else {
		status, v = http.StatusInternalServerError, errorBody(ErrAPI, "the engine's answer could not be read: "+err.Error())
	}
	b, _ := json.Marshal(v) // plain data
	rw.w.WriteHeader(status)
	_, _ = rw.w.Write(append(b, '\n'))
}
