package openai

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// SSEWriter writes server-sent events of JSON data to an HTTP response, flushing each one so
// tokens reach the client as they are produced.
type SSEWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf []byte // the event being written, reused: a stream writes one per token
}

// NewSSEWriter sets the event-stream headers on w. The status (200) goes out with the first event.
func NewSSEWriter(w http.ResponseWriter) *SSEWriter {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // keep reverse proxies from buffering the stream
	return &SSEWriter{w: w, rc: http.NewResponseController(w)}
}

// WriteData writes "data: <json of v>\n\n" and flushes.
func (s *SSEWriter) WriteData(v any) error {
	s.buf = append(s.buf[:0], "data: "...)
	if a, ok := v.(jsonAppender); ok {
		s.buf = a.AppendJSON(s.buf)
	} else {
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("openai: encoding event: %w", err)
		}
		s.buf = append(s.buf, b...)
	}
	return s.flushEvent()
}

// WriteDone writes the terminating "data: [DONE]\n\n".
func (s *SSEWriter) WriteDone() error {
	s.buf = append(append(s.buf[:0], "data: "...), doneMarker...)
	return s.flushEvent()
}

// WriteError writes an error event {"error":{...}}, for failures after the 200 went out.
func (s *SSEWriter) WriteError(e *Error) error { return s.WriteData(e.Body()) }

// flushEvent ends the event in s.buf and sends it.
func (s *SSEWriter) flushEvent() error {
	s.buf = append(s.buf, '\n', '\n')
	if _, err := s.w.Write(s.buf); err != nil {
		return fmt.Errorf("openai: writing event: %w", err)
	}
	if err := s.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return fmt.Errorf("openai: flushing event: %w", err)
	}
	return nil
}

const doneMarker = "[DONE]"

// ErrEventTooLarge is returned by SSEReader.Next for an event over the reader's size cap.
var ErrEventTooLarge = errors.New("openai: server-sent event too large")

// DefaultMaxEventBytes caps one event's data in an SSEReader.
const DefaultMaxEventBytes = 1 << 20

// SSEReader reads the data of server-sent events. Multi-line data is joined with "\n" as the
// event-stream format says; comments and event/id/retry fields are skipped; an event left
// without its closing blank line at the end of input is dropped, as the format requires.
type SSEReader struct {
	r       *bufio.Reader
	max     int
	done    bool
	sawDone bool
}

// NewSSEReader reads events from r with DefaultMaxEventBytes as the cap.
func NewSSEReader(r io.Reader) *SSEReader {
	return &SSEReader{r: bufio.NewReaderSize(r, 16<<10), max: DefaultMaxEventBytes}
}

// SetMaxEventBytes changes the cap on one event's data.
func (s *SSEReader) SetMaxEventBytes(n int) { s.max = n }

// Next returns the data of the next event. It returns io.EOF after "data: [DONE]" or at the end
// of input, and io.ErrUnexpectedEOF if the input ends inside an event.
func (s *SSEReader) Next() ([]byte, error) {
	if s.done {
		return nil, io.EOF
	}
	var data []byte
	have := false
	for {
		line, err := s.readLine()
		if err != nil {
			if err == io.EOF && (have || len(line) > 0) {
				err = io.ErrUnexpectedEOF
			}
			s.done = true
			return nil, err
		}
		if len(line) == 0 {
			if !have {
				continue
			}
			if string(data) == doneMarker {
				s.done, s.sawDone = true, true
				return nil, io.EOF
			}
			return data, nil
		}
		if line[0] == ':' {
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		if string(field) != "data" {
			continue
		}
		value = bytes.TrimPrefix(value, []byte(" "))
		if have {
			data = append(data, '\n')
		}
		if len(data)+len(value) > s.max {
			s.done = true
			return nil, ErrEventTooLarge
		}
		data = append(data, value...)
		have = true
	}
}

// SawDone reports whether the stream ended with "data: [DONE]" rather than with its input.
func (s *SSEReader) SawDone() bool { return s.sawDone }

// readLine returns one line without its terminator (\n, \r\n or \r-less \n only), with io.EOF
// when the input ends, returning any partial last line alongside.
func (s *SSEReader) readLine() ([]byte, error) {
	var line []byte
	for {
		frag, err := s.r.ReadSlice('\n')
		if len(line)+len(frag) > s.max+2 {
			return nil, ErrEventTooLarge
		}
		line = append(line, frag...)
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			return line, err
		}
		line = line[:len(line)-1]
		return bytes.TrimSuffix(line, []byte("\r")), nil
	}
}
