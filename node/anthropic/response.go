package anthropic

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/kvmesh/kvmesh/node/openai"
)

// Response is a non-streamed Messages answer.
type Response struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"`
	Role         string         `json:"role"`
	Model        string         `json:"model"`
	Content      []ContentBlock `json:"content"`
	StopReason   *string        `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        Usage          `json:"usage"`
}

// ContentBlock is a block of an answer: text, or a tool_use with its input.
type ContentBlock struct {
	Type  string          `json:"type"`
	Text  *string         `json:"text,omitempty"`
	ID    string          `json:"id,omitempty"`
	Name  string          `json:"name,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
}

// Usage counts an answer's tokens. InputTokens are the prompt's tokens the engine did not find
// cached; CacheReadInputTokens (present when the engine reports them) those it did, so the
// two add up to the prompt.
type Usage struct {
	InputTokens          int  `json:"input_tokens"`
	OutputTokens         int  `json:"output_tokens"`
	CacheReadInputTokens *int `json:"cache_read_input_tokens,omitempty"`
}

// Stop reasons.
const (
	StopEndTurn      = "end_turn"
	StopMaxTokens    = "max_tokens"
	StopSequence     = "stop_sequence"
	StopToolUse      = "tool_use"
	StopRefusal      = "refusal"
	messageIDPrefix  = "msg_"
	chatIDPrefix     = "chatcmpl-"
	typeMessage      = "message"
	typeText         = "text"
	typeToolUse      = "tool_use"
	finishStop       = "stop"
	finishLength     = "length"
	finishToolCalls  = "tool_calls"
	finishFunction   = "function_call"
	finishFilter     = "content_filter"
	eventError       = "error"
	emptyToolInput   = "{}"
	eventStreamMedia = "text/event-stream"
)

// StopReasonOf maps a chat finish_reason to a stop_reason: stop is end_turn (stop_sequence
// when the text ended with one of the request's stop sequences: stopMatch), length is
// max_tokens, tool_calls and function_call are tool_use, content_filter is refusal; any other
// reason is end_turn.
func StopReasonOf(finish string) string {
	switch finish {
	case finishLength:
		return StopMaxTokens
	case finishToolCalls, finishFunction:
		return StopToolUse
	case finishFilter:
		return StopRefusal
	}
	return StopEndTurn
}

// stopMatch returns text without the stop sequence it ends with and that sequence, the first
// of stops that is a suffix; or text and "" for none. The chat request asked the engine to
// keep the stop sequence in its output (include_stop_str_in_output), so a finish "stop"
// whose text ends with one is that sequence's doing.
func stopMatch(text string, stops []string) (string, string) {
	for _, s := range stops {
		if s != "" && strings.HasSuffix(text, s) {
			return text[:len(text)-len(s)], s
		}
	}
	return text, ""
}

// messageID is the message id of a chat completion id: kvmesh's chatcmpl-<request id> becomes
// msg_<request id>.
func messageID(chatID string) string {
	return messageIDPrefix + strings.TrimPrefix(chatID, chatIDPrefix)
}

func usageOf(u *openai.Usage) Usage {
	if u == nil {
		return Usage{}
	}
	out := Usage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens}
	if d := u.PromptTokensDetails; d != nil {
		cached := min(d.CachedTokens, u.PromptTokens)
		out.InputTokens -= cached
		out.CacheReadInputTokens = &cached
	}
	return out
}

// chatCompletion is what FromChat reads of a chat completion: choice 0 (the request asked
// for one).
type chatCompletion struct {
	ID      string `json:"id"`
	Model   string `json:"model"`
	Choices []struct {
		Message struct {
			Content   *string        `json:"content"`
			ToolCalls []chatCallWire `json:"tool_calls"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage *openai.Usage `json:"usage"`
}

type chatCallWire struct {
	Index    int    `json:"index"`
	ID       string `json:"id"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// FromChat translates a chat completion's JSON into the Messages answer; stops are the
// request's stop sequences. The content is the text block (one, possibly empty, when there is
// nothing else), then a tool_use block per tool call.
func FromChat(body []byte, stops []string) (*Response, error) {
	var c chatCompletion
	if err := json.Unmarshal(body, &c); err != nil {
		return nil, err
	}
	r := &Response{ID: messageID(c.ID), Type: typeMessage, Role: RoleAssistant, Model: c.Model,
		Content: []ContentBlock{}, Usage: usageOf(c.Usage)}
	var text, finish string
	var calls []chatCallWire
	if len(c.Choices) > 0 {
		ch := c.Choices[0]
		if ch.Message.Content != nil {
			text = *ch.Message.Content
		}
		finish, calls = ch.FinishReason, ch.Message.ToolCalls
	}
	reason := StopReasonOf(finish)
	if finish == finishStop {
		var seq string
		if text, seq = stopMatch(text, stops); seq != "" {
			reason, r.StopSequence = StopSequence, &seq
		}
	}
	r.StopReason = &reason
	if text != "" || len(calls) == 0 {
		r.Content = append(r.Content, ContentBlock{Type: typeText, Text: &text})
	}
	for _, tc := range calls {
		r.Content = append(r.Content, ContentBlock{Type: typeToolUse, ID: tc.ID, Name: tc.Function.Name, Input: toolInput(tc.Function.Arguments)})
	}
	return r, nil
}

// toolInput is a tool call's arguments as a tool_use input: the JSON object they are, or {}
// when they are none.
func toolInput(args string) json.RawMessage {
	if t := bytes.TrimSpace([]byte(args)); len(t) > 0 && t[0] == '{' && json.Valid(t) {
		return t
	}
	return json.RawMessage(emptyToolInput)
}

// Error types of the Messages API.
const (
	ErrInvalidRequest = "invalid_request_error"
	ErrAuthentication = "authentication_error"
	ErrPermission     = "permission_error"
	ErrNotFound       = "not_found_error"
	ErrTooLarge       = "request_too_large"
	ErrRateLimit      = "rate_limit_error"
	ErrAPI            = "api_error"
	ErrTimeout        = "timeout_error"
	ErrOverloaded     = "overloaded_error"
)

// StatusOverloaded is the Messages API's status for an overloaded service.
const StatusOverloaded = 529

// ErrorOf maps one of kvmesh's errors (an OpenAI-shaped status and code) to the Messages API's
// status and error type:
//
//	401, 403, 404              the same status: authentication_error, permission_error, not_found_error
//	413                        413 request_too_large
//	429 rate_limited           429 rate_limit_error (the key's own token bucket)
//	any other 429, every 503   529 overloaded_error (the mesh is busy: queue_full, slo_unattainable,
//	                           queue_ttl_expired, carbon_deferred, no_capacity, draining, ...)
//	504                        504 timeout_error
//	any other 4xx              the same status, invalid_request_error
//	any other 5xx              500 api_error
func ErrorOf(status int, code string) (int, string) {
	switch {
	case status == http.StatusUnauthorized:
		return status, ErrAuthentication
	case status == http.StatusForbidden:
		return status, ErrPermission
	case status == http.StatusNotFound:
		return status, ErrNotFound
	case status == http.StatusRequestEntityTooLarge:
		return status, ErrTooLarge
	case status == http.StatusTooManyRequests && code == openai.CodeRateLimited:
		return status, ErrRateLimit
	case status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable:
		return StatusOverloaded, ErrOverloaded
	case status == http.StatusGatewayTimeout:
		return status, ErrTimeout
	case status >= 400 && status < 500:
		return status, ErrInvalidRequest
	}
	return http.StatusInternalServerError, ErrAPI
}

// ErrorBody is the Messages API's error body.
type ErrorBody struct {
	Type  string      `json:"type"`
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inside of an ErrorBody.
type ErrorDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

func errorBody(typ, msg string) ErrorBody {
	return ErrorBody{Type: eventError, Error: ErrorDetail{Type: typ, Message: msg}}
}

// translateError turns an OpenAI error body of status into the Messages API's status and body.
// A body that is not one (an engine's own text) keeps its text as the message.
func translateError(status int, body []byte) (int, ErrorBody) {
	var e openai.ErrorBody
	if json.Unmarshal(body, &e) != nil || e.Error.Message == "" {
		e.Error.Message = strings.TrimSpace(string(body))
	}
	st, typ := ErrorOf(status, e.Error.Code)
	return st, errorBody(typ, e.Error.Message)
}
