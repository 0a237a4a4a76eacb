package anthropic

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// MaxEventBytes bounds one event of a native Messages stream (EventReader) and a native
// Messages answer (Tally.Whole): an engine's answer past it is malformed, not buffered.
const MaxEventBytes = 8 << 20

// ErrEventTooLarge: an event of an engine's Messages stream, or its whole answer, is larger
// than MaxEventBytes.
var ErrEventTooLarge = errors.New("anthropic: event larger than the limit")

// Event is one server-sent event of a Messages stream as an engine sent it: Raw is its bytes,
// through the blank line that ends it, to be relayed as they are; Type the type its data names
// (message_start, content_block_delta, ..., error), "" when its data is no JSON object with
// one.
type Event struct {
	Raw  []byte
	Type string
	Data []byte
}

// EventReader reads the events of a Messages stream whole, keeping their bytes. It does not
// check the order of the events: that is the engine's, relayed as it is.
type EventReader struct {
	r   *bufio.Reader
	buf []byte
}

// NewEventReader reads events from r.
func NewEventReader(r io.Reader) *EventReader {
	return &EventReader{r: bufio.NewReaderSize(r, 16<<10)}
}

// Next returns the next event. It returns io.EOF at the end of input between events, and
// io.ErrUnexpectedEOF when the input ends inside one.
func (er *EventReader) Next() (Event, error) {
	er.buf = er.buf[:0]
	var data []byte
	line := 0 // where the current line begins in buf
	for {
		frag, err := er.r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			err = nil // a long line: read on
		}
		if len(er.buf)+len(frag) > MaxEventBytes {
			return Event{}, ErrEventTooLarge
		}
		er.buf = append(er.buf, frag...)
		switch {
		case err == io.EOF && len(bytes.TrimSpace(er.buf)) == 0:
			return Event{}, io.EOF
		case err == io.EOF:
			return Event{}, io.ErrUnexpectedEOF
		case err != nil:
			return Event{}, err
		case er.buf[len(er.buf)-1] != '\n':
			continue // the rest of a long line
		}
		l := bytes.TrimRight(er.buf[line:], "\r\n")
		line = len(er.buf)
		if d, ok := bytes.CutPrefix(l, []byte("data:")); ok {
			if len(data) > 0 {
				data = append(data, '\n')
			}
			data = append(data, bytes.TrimPrefix(d, []byte(" "))...)
		}
		if len(l) > 0 {
			continue
		}
		if len(bytes.TrimSpace(er.buf)) == 0 {
			er.buf, line = er.buf[:0], 0 // blank lines between events
			continue
		}
		return Event{Raw: bytes.Clone(er.buf), Type: eventType(data), Data: data}, nil
	}
}

// eventType is the type member of an event's data.
func eventType(data []byte) string {
	var v struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(data, &v) != nil {
		return ""
	}
	return v.Type
}

// Tally reads what kvmesh counts from an engine's native Messages answer: the prompt and
// output tokens, the prompt tokens read from the engine's cache, the stop reason and the text,
// from a stream's events (Add) or a whole answer (Whole).
type Tally struct {
	InputTokens  int
	OutputTokens int
	// CachedTokens are cache_read_input_tokens: prompt tokens beside InputTokens.
	CachedTokens int
	StopReason   string
	// Stopped: message_stop arrived (a stream) or the answer was read (Whole); Failed: an
	// error event arrived, with Error its message.
	Stopped bool
	Failed  bool
	Error   string
}

// usageWire is the usage object of message_start's message, message_delta and a whole answer.
type usageWire struct {
	InputTokens          *int `json:"input_tokens"`
	OutputTokens         *int `json:"output_tokens"`
	CacheReadInputTokens *int `json:"cache_read_input_tokens"`
}

func (t *Tally) usage(u *usageWire) {
	if u == nil {
		return
	}
	if u.InputTokens != nil {
		t.InputTokens = *u.InputTokens
	}
	if u.OutputTokens != nil {
		t.OutputTokens = *u.OutputTokens
	}
	if u.CacheReadInputTokens != nil {
		t.CachedTokens = *u.CacheReadInputTokens
	}
}

// eventWire is the part of a stream event's data Tally reads.
type eventWire struct {
	Message *struct {
		Usage *usageWire `json:"usage"`
	} `json:"message"`
	Delta *struct {
		Type       string `json:"type"`
		Text       string `json:"text"`
		StopReason string `json:"stop_reason"`
	} `json:"delta"`
	Usage *usageWire   `json:"usage"`
	Error *ErrorDetail `json:"error"`
}

// Add counts ev and returns the text it adds (a text_delta's). An event whose data does not
// decode counts nothing: it is relayed as it is.
func (t *Tally) Add(ev Event) string {
	var w eventWire
	if json.Unmarshal(ev.Data, &w) != nil {
		return ""
	}
	switch ev.Type {
	case EventMessageStart:
		if w.Message != nil {
			t.usage(w.Message.Usage)
		}
	case EventContentBlockDelta:
		if w.Delta != nil && w.Delta.Type == "text_delta" {
			return w.Delta.Text
		}
	case EventMessageDelta:
		if w.Delta != nil && w.Delta.StopReason != "" {
			t.StopReason = w.Delta.StopReason
		}
		t.usage(w.Usage)
	case EventMessageStop:
		t.Stopped = true
	case EventError:
		t.Failed = true
		if w.Error != nil {
			t.Error = w.Error.Message
		}
	}
	return ""
}

// Whole counts a non-streamed answer and returns its text (its text blocks').
func (t *Tally) Whole(body []byte) (string, error) {
	if len(body) > MaxEventBytes {
		return "", ErrEventTooLarge
	}
	var w struct {
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		StopReason *string    `json:"stop_reason"`
		Usage      *usageWire `json:"usage"`
	}
	if err := json.Unmarshal(body, &w); err != nil {
		return "", fmt.Errorf("anthropic: the engine's answer: %w", err)
	}
	var text string
	for _, b := range w.Content {
		if b.Type == typeText {
			text += b.Text
		}
	}
	if w.StopReason != nil {
		t.StopReason = *w.StopReason
	}
	t.usage(w.Usage)
	t.Stopped = true
	return text, nil
}

// FinishOf maps a stop_reason to a chat finish_reason (StopReasonOf's inverse): max_tokens is
// length, tool_use is tool_calls, refusal is content_filter, any other is stop.
func FinishOf(stop string) string {
	switch stop {
	case StopMaxTokens:
		return finishLength
	case StopToolUse:
		return finishToolCalls
	case StopRefusal:
		return finishFilter
	}
	return finishStop
}

// ErrorEvent is an error event of the Messages API's stream: what ends a stream that cannot
// go on (an api_error, as the API sends for a failure mid-stream), so a client never reads a
// stream that stopped without a word.
func ErrorEvent(msg string) []byte {
	b, _ := json.Marshal(errorBody(ErrAPI, msg)) // plain data
	out := make([]byte, 0, len(b)+32)
	out = append(append(out, "event: error\ndata: "...), b...)
	return append(out, '\n', '\n')
}
