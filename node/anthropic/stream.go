package anthropic

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"

	"github.com/kvmesh/kvmesh/node/openai"
)

// Streaming event types.
const (
	EventMessageStart      = "message_start"
	EventContentBlockStart = "content_block_start"
	EventPing              = "ping"
	EventContentBlockDelta = "content_block_delta"
	EventContentBlockStop  = "content_block_stop"
	EventMessageDelta      = "message_delta"
	EventMessageStop       = "message_stop"
	EventError             = eventError
)

// emitFunc sends one event: its type and its data object.
type emitFunc func(event string, data any) error

// streamer turns the data of a chat stream's server-sent events into the Messages API's events,
// in the order the API gives them:
//
//	message_start (usage.input_tokens the ingress's count of the prompt, output_tokens 0),
//	then per block content_block_start (a ping after the first),
//	content_block_delta..., content_block_stop, then message_delta (stop_reason,
//	stop_sequence, usage: the engine's final counts), message_stop
//
// The text is one block; each tool call is a tool_use block whose arguments arrive as
// input_json_delta. A message with no content has one empty text block. While the request has
// stop sequences, the last bytes of the text (as many as the longest sequence) are held back
// until the next delta, so a sequence that ends the text is never sent (stopMatch). An error
// event of the chat stream is an error event, and the stream ends there.
type streamer struct {
	emit    emitFunc
	stops   []string
	holdMax int
	input   int // message_start's input_tokens: the ingress's count of the prompt

	started  bool
	ended    bool
	open     int // index of the open block, -1 for none
	openType string
	blocks   int
	pinged   bool
	held     string
	finish   string
	usage    *openai.Usage
	calls    map[int]int // a chat tool call's index to its block's
}

func newStreamer(emit emitFunc, stops []string) *streamer {
	s := &streamer{emit: emit, stops: stops, open: -1, calls: map[int]int{}}
	for _, st := range stops {
		s.holdMax = max(s.holdMax, len(st))
	}
	return s
}

type chunkWire struct {
	ID      string `json:"id"`
	Model   string `json:"model"`
	Choices []struct {
		Delta struct {
			Content   *string        `json:"content"`
			ToolCalls []chatCallWire `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *openai.Usage       `json:"usage"`
	Error *openai.ErrorDetail `json:"error"`
}

// data handles one chat event's data. After the stream ended it does nothing.
func (s *streamer) data(d []byte) error {
	if s.ended {
		return nil
	}
	if string(bytes.TrimSpace(d)) == "[DONE]" {
		return s.done()
	}
	var c chunkWire
	if err := json.Unmarshal(d, &c); err != nil {
		return s.fail(ErrAPI, "the engine's stream could not be read: "+err.Error())
	}
	if c.Error != nil {
		s.ended = true
		_, typ := ErrorOf(statusOfStreamError(c.Error.Code), c.Error.Code)
		return s.emit(EventError, errorBody(typ, c.Error.Message))
	}
	if err := s.start(c.ID, c.Model); err != nil {
		return err
	}
	if c.Usage != nil {
		s.usage = c.Usage
	}
	for _, ch := range c.Choices {
		if ch.Delta.Content != nil && *ch.Delta.Content != "" {
			if err := s.text(*ch.Delta.Content); err != nil {
				return err
			}
		}
		for _, tc := range ch.Delta.ToolCalls {
			if err := s.toolCall(tc); err != nil {
				return err
			}
		}
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			s.finish = *ch.FinishReason
		}
	}
	return nil
}

// statusOfStreamError is the status an error event stands for: kvmesh sends them after the
// 200 for a failure (engine_error) or a drain.
func statusOfStreamError(code string) int {
	if code == "draining" {
		return 503
	}
	return 500
}

func (s *streamer) fail(typ, msg string) error {
	s.ended = true
	return s.emit(EventError, errorBody(typ, msg))
}

// start sends message_start, once.
func (s *streamer) start(chatID, model string) error {
	if s.started {
		return nil
	}
	s.started = true
	return s.emit(EventMessageStart, map[string]any{"type": EventMessageStart, "message": Response{
		ID: messageID(chatID), Type: typeMessage, Role: RoleAssistant, Model: model, Content: []ContentBlock{},
		Usage: Usage{InputTokens: s.input},
	}})
}

// openBlock closes the open block and starts one of b's type.
func (s *streamer) openBlock(b ContentBlock) error {
	if err := s.closeBlock(); err != nil {
		return err
	}
	s.open, s.openType = s.blocks, b.Type
	s.blocks++
	if err := s.emit(EventContentBlockStart, map[string]any{"type": EventContentBlockStart, "index": s.open, "content_block": b}); err != nil {
		return err
	}
	if !s.pinged {
		s.pinged = true
		return s.emit(EventPing, map[string]string{"type": EventPing})
	}
	return nil
}

func (s *streamer) closeBlock() error {
	if s.open < 0 {
		return nil
	}
	i := s.open
	s.open = -1
	return s.emit(EventContentBlockStop, map[string]any{"type": EventContentBlockStop, "index": i})
}

// text adds text to the text block, holding back what may be the start of a stop sequence.
func (s *streamer) text(t string) error {
	s.held += t
	cut := len(s.held) - s.holdMax
	for cut > 0 && cut < len(s.held) && !utf8.RuneStart(s.held[cut]) {
		cut--
	}
	if cut <= 0 {
		return nil
	}
	out := s.held[:cut]
	s.held = s.held[cut:]
	return s.sendText(out)
}

func (s *streamer) sendText(t string) error {
	if t == "" {
		return nil
	}
	if s.openType != typeText || s.open < 0 {
		empty := ""
		if err := s.openBlock(ContentBlock{Type: typeText, Text: &empty}); err != nil {
			return err
		}
	}
	return s.emit(EventContentBlockDelta, map[string]any{"type": EventContentBlockDelta, "index": s.open,
		"delta": map[string]string{"type": "text_delta", "text": t}})
}

// toolCall adds a piece of a tool call: its first piece opens its tool_use block.
func (s *streamer) toolCall(tc chatCallWire) error {
	if err := s.sendText(s.held); err != nil {
		return err
	}
	s.held = ""
	if _, ok := s.calls[tc.Index]; !ok {
		if err := s.openBlock(ContentBlock{Type: typeToolUse, ID: tc.ID, Name: tc.Function.Name, Input: json.RawMessage(emptyToolInput)}); err != nil {
			return err
		}
		s.calls[tc.Index] = s.open
	}
	if tc.Function.Arguments == "" {
		return nil
	}
	return s.emit(EventContentBlockDelta, map[string]any{"type": EventContentBlockDelta, "index": s.calls[tc.Index],
		"delta": map[string]string{"type": "input_json_delta", "partial_json": tc.Function.Arguments}})
}

// done ends the message: the held text less a stop sequence that ends it, the open block's
// stop, message_delta and message_stop.
func (s *streamer) done() error {
	if err := s.start("", ""); err != nil {
		return err
	}
	s.ended = true
	reason := StopReasonOf(s.finish)
	var seq *string
	text := s.held
	if s.finish == finishStop {
		var m string
		if text, m = stopMatch(text, s.stops); m != "" {
			reason, seq = StopSequence, &m
		}
	}
	if err := s.sendText(text); err != nil {
		return err
	}
	if s.blocks == 0 {
		empty := ""
		if err := s.openBlock(ContentBlock{Type: typeText, Text: &empty}); err != nil {
			return err
		}
	}
	if err := s.closeBlock(); err != nil {
		return err
	}
	u := usageOf(s.usage)
	if err := s.emit(EventMessageDelta, map[string]any{"type": EventMessageDelta,
		"delta": map[string]*string{"stop_reason": &reason, "stop_sequence": seq}, "usage": u}); err != nil {
		return err
	}
	return s.emit(EventMessageStop, map[string]string{"type": EventMessageStop})
}
