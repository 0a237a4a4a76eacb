package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// ChatRequest is the body of POST /v1/chat/completions, every field of the public API. Pointer
// fields are nil when the client left them out. Fields kvmesh does not interpret are kept as raw
// JSON so external engines receive them unchanged.
type ChatRequest struct {
	Model               string             `json:"model"`
	Messages            []Message          `json:"messages"`
	MaxTokens           *int               `json:"max_tokens,omitempty"`
	MaxCompletionTokens *int               `json:"max_completion_tokens,omitempty"`
	Stream              bool               `json:"stream,omitempty"`
	StreamOptions       *StreamOptions     `json:"stream_options,omitempty"`
	Stop                Stop               `json:"stop,omitempty"`
	Temperature         *float64           `json:"temperature,omitempty"`
	TopP                *float64           `json:"top_p,omitempty"`
	N                   *int               `json:"n,omitempty"`
	Seed                *int64             `json:"seed,omitempty"`
	User                string             `json:"user,omitempty"`
	PresencePenalty     *float64           `json:"presence_penalty,omitempty"`
	FrequencyPenalty    *float64           `json:"frequency_penalty,omitempty"`
	Logprobs            *bool              `json:"logprobs,omitempty"`
	TopLogprobs         *int               `json:"top_logprobs,omitempty"`
	LogitBias           map[string]float64 `json:"logit_bias,omitempty"`
	ResponseFormat      json.RawMessage    `json:"response_format,omitempty"`
	Tools               json.RawMessage    `json:"tools,omitempty"`
	ToolChoice          json.RawMessage    `json:"tool_choice,omitempty"`
	ParallelToolCalls   *bool              `json:"parallel_tool_calls,omitempty"`
	Functions           json.RawMessage    `json:"functions,omitempty"`     // deprecated by tools
	FunctionCall        json.RawMessage    `json:"function_call,omitempty"` // deprecated by tool_choice
	Metadata            map[string]string  `json:"metadata,omitempty"`
	Store               *bool              `json:"store,omitempty"`
	ServiceTier         string             `json:"service_tier,omitempty"`
	ReasoningEffort     string             `json:"reasoning_effort,omitempty"`
	Modalities          []string           `json:"modalities,omitempty"`
	Audio               json.RawMessage    `json:"audio,omitempty"`
	Prediction          json.RawMessage    `json:"prediction,omitempty"`
	WebSearchOptions    json.RawMessage    `json:"web_search_options,omitempty"`
	PromptCacheKey      string             `json:"prompt_cache_key,omitempty"`
	SafetyIdentifier    string             `json:"safety_identifier,omitempty"`
	Verbosity           string             `json:"verbosity,omitempty"`
}

// Message is one chat message. Content arrives as a string or as an array of parts; text parts
// are flattened (concatenated) into Content.Text.
type Message struct {
	Role       string          `json:"role"`
	Content    Content         `json:"content"`
	Name       string          `json:"name,omitempty"`
	ToolCalls  json.RawMessage `json:"tool_calls,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
	Refusal    *string         `json:"refusal,omitempty"`
	// FunctionCall is the deprecated form of ToolCalls.
	FunctionCall json.RawMessage `json:"function_call,omitempty"`
	Audio        json.RawMessage `json:"audio,omitempty"`
}

// Content is a message's text. Null marks JSON null (an assistant turn with only tool calls).
type Content struct {
	Text string
	Null bool
}

// UnmarshalJSON accepts a string, null, or an array of {"type":"text","text":...} parts.
// Parts of other types (images, audio, files) are rejected: kvmesh routes text only.
func (c *Content) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case bytes.Equal(b, []byte("null")):
		*c = Content{Null: true}
		return nil
	case len(b) > 0 && b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*c = Content{Text: s}
		return nil
	case len(b) > 0 && b[0] == '[':
		// Parts are read leniently so an image part is reported as unsupported, not malformed.
		var parts []ContentPart
		if err := json.Unmarshal(b, &parts); err != nil {
			return errContent
		}
		var sb strings.Builder
		for _, p := range parts {
			if p.Type != "text" {
				return errContentPart
			}
			sb.WriteString(p.Text)
		}
		*c = Content{Text: sb.String()}
		return nil
	}
	return errContent
}

// MarshalJSON writes the flattened text (or null).
func (c Content) MarshalJSON() ([]byte, error) {
	if c.Null {
		return []byte("null"), nil
	}
	return json.Marshal(c.Text)
}

// Text returns the message's flattened text content ("" for null).
func (m Message) Text() string { return m.Content.Text }

// ContentPart is one element of an array content.
type ContentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

var (
	errContent     = errors.New("content must be a string or an array of text parts")
	errContentPart = errors.New("only content parts of type \"text\" are supported")
	errStop        = errors.New("stop must be a string or an array of strings")
	errPrompt      = errors.New("prompt must be a string or an array of one string")
)

// StreamOptions are the options of a streamed response.
type StreamOptions struct {
	IncludeUsage       bool  `json:"include_usage,omitempty"`
	IncludeObfuscation *bool `json:"include_obfuscation,omitempty"`
}

// Stop is the stop sequences, sent as a string or an array of strings.
type Stop []string

// UnmarshalJSON accepts null, a string or an array of strings.
func (s *Stop) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		*s = nil
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var one string
		if err := json.Unmarshal(b, &one); err != nil {
			return err
		}
		*s = Stop{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errStop
	}
	*s = many
	return nil
}

// CompletionRequest is the body of POST /v1/completions (the legacy text completion API).
type CompletionRequest struct {
	Model            string             `json:"model"`
	Prompt           *Prompt            `json:"prompt"`
	MaxTokens        *int               `json:"max_tokens,omitempty"`
	Stream           bool               `json:"stream,omitempty"`
	StreamOptions    *StreamOptions     `json:"stream_options,omitempty"`
	Stop             Stop               `json:"stop,omitempty"`
	Temperature      *float64           `json:"temperature,omitempty"`
	TopP             *float64           `json:"top_p,omitempty"`
	N                *int               `json:"n,omitempty"`
	Seed             *int64             `json:"seed,omitempty"`
	User             string             `json:"user,omitempty"`
	Echo             *bool              `json:"echo,omitempty"`
	Logprobs         *int               `json:"logprobs,omitempty"`
	Suffix           *string            `json:"suffix,omitempty"`
	BestOf           *int               `json:"best_of,omitempty"`
	PresencePenalty  *float64           `json:"presence_penalty,omitempty"`
	FrequencyPenalty *float64           `json:"frequency_penalty,omitempty"`
	LogitBias        map[string]float64 `json:"logit_bias,omitempty"`
}

// Prompt is a completion prompt: a string, or an array holding exactly one string (batched
// prompts and token-id prompts are not supported).
type Prompt struct {
	Text string
}

// UnmarshalJSON accepts a string or a one-element array of strings.
func (p *Prompt) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		return json.Unmarshal(b, &p.Text)
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil || len(many) != 1 {
		return errPrompt
	}
	p.Text = many[0]
	return nil
}

// PromptText returns the prompt's text ("" if absent).
func (r *CompletionRequest) PromptText() string {
	if r.Prompt == nil {
		return ""
	}
	return r.Prompt.Text
}

// MarshalJSON writes the prompt as a string.
func (p Prompt) MarshalJSON() ([]byte, error) { return json.Marshal(p.Text) }

// DefaultBodyLimit is a reasonable cap on a request body: about a million tokens of prompt.
const DefaultBodyLimit = 4 << 20

// DecodeChat reads and validates a chat completions body of at most limit bytes (0 means
// DefaultBodyLimit). It returns the concrete *Error so callers can send it without a type check;
// keep it in a *Error variable, not an error interface, to avoid a non-nil nil.
func DecodeChat(r io.Reader, limit int64) (*ChatRequest, *Error) {
	var req ChatRequest
	if err := decodeStrict(r, limit, &req); err != nil {
		return nil, err
	}
	if req.Model == "" {
		return nil, ErrInvalidParameter("model", "model is required")
	}
	if len(req.Messages) == 0 {
		return nil, ErrInvalidParameter("messages", "messages must be a non-empty array")
	}
	for i, m := range req.Messages {
		if m.Role == "" {
			p := fmt.Sprintf("messages[%d].role", i)
			return nil, ErrInvalidParameter(p, p+" is required")
		}
	}
	return &req, nil
}

// DecodeCompletion reads and validates a completions body of at most limit bytes, like DecodeChat.
func DecodeCompletion(r io.Reader, limit int64) (*CompletionRequest, *Error) {
	var req CompletionRequest
	if err := decodeStrict(r, limit, &req); err != nil {
		return nil, err
	}
	if req.Model == "" {
		return nil, ErrInvalidParameter("model", "model is required")
	}
	if req.Prompt == nil {
		return nil, ErrInvalidParameter("prompt", "prompt is required")
	}
	return &req, nil
}

// decodeStrict reads at most limit bytes and decodes exactly one JSON object into v.
func decodeStrict(r io.Reader, limit int64, v any) *Error {
	if limit <= 0 {
		limit = DefaultBodyLimit
	}
	body, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return ErrInvalidRequest("reading request body: " + err.Error())
	}
	if int64(len(body)) > limit {
		return ErrBodyTooLarge(fmt.Sprintf("request body is over the limit of %d bytes", limit))
	}
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return ErrInvalidRequest("request body is empty")
	}
	if trimmed[0] != '{' {
		return ErrInvalidRequest("request body must be a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	if rest := bytes.TrimSpace(trimmed[dec.InputOffset():]); len(rest) > 0 {
		return ErrInvalidRequest("unexpected data after the JSON object")
	}
	return nil
}

// decodeError turns encoding/json's errors into 400s that name the field.
func decodeError(err error) *Error {
	var typeErr *json.UnmarshalTypeError
	var synErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		field := typeErr.Field
		if field == "" {
			return ErrInvalidRequest("request body must be a JSON object")
		}
		return ErrInvalidParameter(field, fmt.Sprintf("field %q must be of type %s, not %s",
			field, jsonType(typeErr.Type.Kind().String()), typeErr.Value))
	case errors.As(err, &synErr):
		return ErrInvalidRequest(fmt.Sprintf("invalid JSON at byte %d: %v", synErr.Offset, synErr))
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return ErrInvalidRequest("request body is truncated JSON")
	}
	msg := err.Error()
	if f, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		name := strings.Trim(f, `"`)
		return ErrInvalidParameter(name, "unknown field "+f)
	}
	// Errors from our own UnmarshalJSON methods arrive wrapped with the field path.
	if f := fieldOf(err); f != "" {
		return ErrInvalidParameter(f, f+": "+msg)
	}
	return ErrInvalidRequest("invalid request body: " + strings.TrimPrefix(msg, "json: "))
}

// fieldOf names the field of an error from one of our UnmarshalJSON methods ("" if none):
// encoding/json passes those errors through without the field path.
func fieldOf(err error) string {
	switch {
	case errors.Is(err, errStop):
		return "stop"
	case errors.Is(err, errPrompt):
		return "prompt"
	case errors.Is(err, errContent), errors.Is(err, errContentPart):
		return "messages.content"
	}
	return ""
}

func jsonType(kind string) string {
	switch kind {
	case "string":
		return "string"
	case "bool":
		return "boolean"
	case "slice", "array":
		return "array"
	case "map", "struct", "ptr":
		return "object"
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "integer"
	case "float32", "float64":
		return "number"
	}
	return kind
}
