package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
)

// ChatRequest is the body of POST /v1/chat/completions. Its typed fields are the ones kvmesh
// reads (to validate, route and admit the request, or to run it on the embedded engine), and
// they are checked strictly: a wrong type is a 400 that names the field. Every other member is
// kept in Extra with its value as sent: an external engine receives the client's body, so a
// field only the engine knows (vLLM's top_k, guided_json, chat_template_kwargs, ...) reaches
// it untouched, and the embedded engine decides for itself what to make of each. Pointer fields
// are nil when the client left them out.
type ChatRequest struct {
	Generation
	Messages            []Message `json:"messages"`
	MaxCompletionTokens *int      `json:"max_completion_tokens,omitempty"`
	Logprobs            *bool     `json:"logprobs,omitempty"`
	TopLogprobs         *int      `json:"top_logprobs,omitempty"`
	// Extra are the body's other members, in body order.
	Extra Fields `json:"-"`
}

// Generation holds the members kvmesh reads that chat and completion requests share.
type Generation struct {
	Model         string         `json:"model"`
	MaxTokens     *int           `json:"max_tokens,omitempty"`
	Stream        bool           `json:"stream,omitempty"`
	StreamOptions *StreamOptions `json:"stream_options,omitempty"`
	Stop          Stop           `json:"stop,omitempty"`
	Temperature   *float64       `json:"temperature,omitempty"`
	TopP          *float64       `json:"top_p,omitempty"`
	N             *int           `json:"n,omitempty"`
	Seed          *int64         `json:"seed,omitempty"`
	User          string         `json:"user,omitempty"`
}

// member returns where the value of the shared member name goes, nil for another.
func (g *Generation) member(name string) any {
	switch name {
	case "model":
		return &g.Model
	case "max_tokens":
		return integer(&g.MaxTokens)
	case "stream":
		return &g.Stream
	case "stream_options":
		return &g.StreamOptions
	case "stop":
		return &g.Stop
	case "temperature":
		return &g.Temperature
	case "top_p":
		return &g.TopP
	case "n":
		return integer(&g.N)
	case "seed":
		return integer(&g.Seed)
	case "user":
		return &g.User
	}
	return nil
}

// intField is where a member kvmesh reads as an integer is decoded.
type intField[T int | int64] struct{ p **T }

func integer[T int | int64](p **T) *intField[T] { return &intField[T]{p} }

// UnmarshalJSON takes an integer, or a number with a zero fraction (3.0, 1e2) as vLLM's
// validation does; null leaves the field unset. Another number is a *json.UnmarshalTypeError
// (decodeError tells a fraction from a number out of range), as is any other value.
func (f *intField[T]) UnmarshalJSON(b []byte) error {
	s := string(bytes.TrimSpace(b))
	if s == "null" {
		*f.p = nil
		return nil
	}
	typeErr := &json.UnmarshalTypeError{Value: jsonKind(s), Type: reflect.TypeFor[T]()}
	if typeErr.Value != "number" {
		return typeErr
	}
	typeErr.Value = "number " + s
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		fl, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || fl != math.Trunc(fl) || fl < math.MinInt64 || fl >= math.MaxInt64 {
			return typeErr
		}
		v = int64(fl)
	}
	if int64(T(v)) != v {
		return typeErr
	}
	t := T(v)
	*f.p = &t
	return nil
}

// jsonKind names the type of the JSON value s as encoding/json's errors do.
func jsonKind(s string) string {
	switch {
	case s == "":
		return "nothing"
	case s[0] == '"':
		return "string"
	case s[0] == 't' || s[0] == 'f':
		return "bool"
	case s[0] == '[':
		return "array"
	case s[0] == '{':
		return "object"
	}
	return "number"
}

// member returns where the value of the member name goes, nil for a member kvmesh does not read.
func (r *ChatRequest) member(name string) any {
	switch name {
	case "messages":
		return (*messageList)(&r.Messages)
	case "max_completion_tokens":
		return integer(&r.MaxCompletionTokens)
	case "logprobs":
		return &r.Logprobs
	case "top_logprobs":
		return integer(&r.TopLogprobs)
	}
	return r.Generation.member(name)
}

// MarshalJSON writes the typed fields, then Extra's members.
func (r ChatRequest) MarshalJSON() ([]byte, error) {
	type plain ChatRequest
	b, err := json.Marshal(plain(r))
	if err != nil {
		return nil, err
	}
	return r.Extra.appendTo(b), nil
}

// Message is one chat message: the role and the text kvmesh renders into the prompt it routes
// on. Content arrives as a string or as an array of parts; text parts are flattened
// (concatenated) into Content.Text, and the others kept as sent in Content.Parts. Its other
// members (name, tool_calls, tool_call_id, vLLM's reasoning_content, ...) are not kept:
// external engines read them from the client's body. Role is any non-empty string here; the
// engine decides which roles it knows.
type Message struct {
	Role    string  `json:"role"`
	Content Content `json:"content"`
}

// UnmarshalJSON decodes role and content, names matched exactly as a request's are, and skips
// the other members.
func (m *Message) UnmarshalJSON(b []byte) error {
	return m.decode(json.NewDecoder(bytes.NewReader(b)))
}

// decode reads the message, an object, from dec.
func (m *Message) decode(dec *json.Decoder) error {
	*m = Message{}
	return decodeMembers(dec, func(name string) any {
		switch name {
		case "role":
			return &m.Role
		case "content":
			return &m.Content
		}
		return nil
	}, nil)
}

// messageList decodes messages one by one, so that an error names its message: a wrong type
// is at messages[2].role, as a missing role is. One decoder reads them all (one a message
// doubled the cost of decoding a chat request).
type messageList []Message

func (l *messageList) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	t, err := dec.Token()
	switch {
	case err != nil:
		return err
	case t == nil: // null: no messages, as an empty list
		*l = nil
		return nil
	case t != json.Delim('['):
		return &json.UnmarshalTypeError{Value: jsonKind(string(bytes.TrimSpace(b))), Type: reflect.TypeFor[[]Message]()}
	}
	var out []Message
	for i := 0; dec.More(); i++ {
		var m Message
		if err := m.decode(dec); err != nil {
			return inField(fmt.Sprintf("[%d]", i), err)
		}
		out = append(out, m)
	}
	*l = out
	return nil
}

// Roles known to the OpenAI chat API.
var knownRoles = map[string]bool{
	"system": true, "developer": true, "user": true, "assistant": true, "tool": true, "function": true,
}

// KnownRole reports whether role is one of the OpenAI chat API's: system, developer, user,
// assistant, tool and the deprecated function.
func KnownRole(role string) bool { return knownRoles[role] }

var (
	errStop   = errors.New("stop must be a string or an array of strings")
	errPrompt = errors.New("prompt must be a string or an array of one string")
	// A client that sends vLLM token ids or an SDK batch is told why, not just the shape.
	errPromptIDs   = errors.New("prompt as token ids is not supported: kvmesh routes and admits by the prompt's text; send it as a string")
	errPromptBatch = errors.New("a batch of prompts is not supported: send one request per prompt (each is one stream, held to one SLO)")
)

// StreamOptions are the options of a streamed response. kvmesh reads include_usage; the other
// members (include_obfuscation, vLLM's continuous_usage_stats, ...) are kept in Extra.
type StreamOptions struct {
	IncludeUsage bool `json:"include_usage,omitempty"`
	// Extra are the other members, in body order.
	Extra Fields `json:"-"`
}

func (o *StreamOptions) member(name string) any {
	if name == "include_usage" {
		return &o.IncludeUsage
	}
	return nil
}

// UnmarshalJSON decodes the object, keeping unread members in Extra. null leaves o unchanged.
func (o *StreamOptions) UnmarshalJSON(b []byte) error {
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		return nil
	}
	*o = StreamOptions{}
	return decodeMembers(json.NewDecoder(bytes.NewReader(b)), o.member, &o.Extra)
}

// MarshalJSON writes include_usage, then Extra's members.
func (o StreamOptions) MarshalJSON() ([]byte, error) {
	type plain StreamOptions
	b, err := json.Marshal(plain(o))
	if err != nil {
		return nil, err
	}
	return o.Extra.appendTo(b), nil
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

// CompletionRequest is the body of POST /v1/completions (the legacy text completion API), read
// as ChatRequest is: typed fields for what kvmesh reads, Extra for the rest.
type CompletionRequest struct {
	Generation
	Prompt   *Prompt `json:"prompt"`
	Echo     *bool   `json:"echo,omitempty"`
	Logprobs *int    `json:"logprobs,omitempty"`
	// Extra are the body's other members (suffix, best_of, vLLM's sampling fields, ...), in
	// body order.
	Extra Fields `json:"-"`
}

func (r *CompletionRequest) member(name string) any {
	switch name {
	case "prompt":
		return &r.Prompt
	case "echo":
		return &r.Echo
	case "logprobs":
		return integer(&r.Logprobs)
	}
	return r.Generation.member(name)
}

// MarshalJSON writes the typed fields, then Extra's members.
func (r CompletionRequest) MarshalJSON() ([]byte, error) {
	type plain CompletionRequest
	b, err := json.Marshal(plain(r))
	if err != nil {
		return nil, err
	}
	return r.Extra.appendTo(b), nil
}

// Prompt is a completion prompt: a string, or an array holding exactly one string. Token ids
// are refused: the node routes and admits by the prompt's text, and a continuation on another
// node (migrate.go) re-sends the prompt as text. A batch is refused too: one request is one
// stream, held to one SLO.
type Prompt struct {
	Text string
}

// UnmarshalJSON accepts a string or a one-element array of strings.
func (p *Prompt) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		return json.Unmarshal(b, &p.Text)
	}
	var many []json.RawMessage
	if json.Unmarshal(b, &many) != nil || len(many) == 0 {
		return errPrompt
	}
	switch first := bytes.TrimSpace(many[0]); {
	case len(first) == 0:
	case first[0] == '[' || first[0] == '-' || (first[0] >= '0' && first[0] <= '9'):
		return errPromptIDs
	case first[0] == '"' && len(many) > 1:
		return errPromptBatch
	case len(many) == 1 && json.Unmarshal(first, &p.Text) == nil:
		return nil
	}
	return errPrompt
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

// Field is a request member kvmesh does not read: its name and its value as the client sent it.
type Field struct {
	Name  string
	Value json.RawMessage
}

// Fields are a request's members kvmesh does not read, in body order.
type Fields []Field

// appendTo adds f's members to b, an encoded JSON object, before its closing brace.
func (f Fields) appendTo(b []byte) []byte {
	if len(f) == 0 || len(b) < 2 {
		return b
	}
	out := b[:len(b)-1]
	for _, m := range f {
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = appendString(out, m.Name)
		out = append(out, ':')
		if len(m.Value) == 0 {
			out = append(out, "null"...)
		} else {
			out = append(out, m.Value...)
		}
	}
	return append(out, '}')
}
