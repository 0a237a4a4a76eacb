package openai

import "encoding/json"

// Object names of the response types.
const (
	ObjectChatCompletion      = "chat.completion"
	ObjectChatCompletionChunk = "chat.completion.chunk"
	ObjectTextCompletion      = "text_completion"
	ObjectList                = "list"
	ObjectModel               = "model"
	RoleAssistant             = "assistant"
)

// Usage counts a request's tokens.
type Usage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

// PromptTokensDetails breaks down the prompt tokens.
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// NewUsage fills TotalTokens and the cached-token detail.
func NewUsage(prompt, completion, cached int) *Usage {
	return &Usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion,
		PromptTokensDetails: &PromptTokensDetails{CachedTokens: cached}}
}

// ChatCompletion is a non-streamed chat response.
type ChatCompletion struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	SystemFingerprint string       `json:"system_fingerprint,omitempty"`
	Choices           []ChatChoice `json:"choices"`
	Usage             *Usage       `json:"usage,omitempty"`
}

// ChatChoice is one choice of a ChatCompletion.
type ChatChoice struct {
	Index        int             `json:"index"`
	Message      ResponseMessage `json:"message"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason string          `json:"finish_reason"`
}

// ResponseMessage is the assistant message of a ChatChoice. Content is null when the message
// is tool calls alone.
type ResponseMessage struct {
	Role      string     `json:"role"`
	Content   *string    `json:"content"`
	Refusal   *string    `json:"refusal"`
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
}

// ToolCall is one tool call of a response: whole in a ResponseMessage (Index left out), a
// piece in a Delta (Index says which call; ID, Type and Name only on its first piece,
// Arguments the next fragment of its JSON arguments).
type ToolCall struct {
	Index    *int         `json:"index,omitempty"`
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"`
	Function FunctionCall `json:"function"`
}

// FunctionCall is the function a ToolCall calls and its arguments, a JSON text.
type FunctionCall struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// ToolTypeFunction is the type of every tool call.
const ToolTypeFunction = "function"

// MarshalJSON keeps choices an array and logprobs null.
func (c ChatCompletion) MarshalJSON() ([]byte, error) {
	type plain ChatCompletion
	if c.Choices == nil {
		c.Choices = []ChatChoice{}
	}
	for i := range c.Choices {
		c.Choices[i].Logprobs = nullIfEmpty(c.Choices[i].Logprobs)
	}
	return json.Marshal(plain(c))
}

// ChatCompletionChunk is one event of a streamed chat response. FinishReason of a choice is
// null until the last content chunk. When IncludeUsage is set (the client asked for
// stream_options.include_usage), every chunk carries "usage": null except the final usage chunk,
// which has "choices": [] and the usage; otherwise usage is left out.
type ChatCompletionChunk struct {
	ID                string        `json:"id"`
	Object            string        `json:"object"`
	Created           int64         `json:"created"`
	Model             string        `json:"model"`
	SystemFingerprint string        `json:"system_fingerprint,omitempty"`
	Choices           []ChunkChoice `json:"choices"`
	Usage             *Usage        `json:"usage"`
	IncludeUsage      bool          `json:"-"`
}

// ChunkChoice is one choice of a ChatCompletionChunk.
type ChunkChoice struct {
	Index        int             `json:"index"`
	Delta        Delta           `json:"delta"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
}

// Delta is the increment of a chunk: the role on the first chunk, then content or pieces of
// tool calls; {} on the finishing chunk.
type Delta struct {
	Role      string     `json:"role,omitempty"`
	Content   *string    `json:"content,omitempty"`
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
}

// MarshalJSON applies the usage rule of ChatCompletionChunk.
func (c ChatCompletionChunk) MarshalJSON() ([]byte, error) { return c.AppendJSON(nil), nil }

// marshalReflect is MarshalJSON by reflection: the reference the hand-written encoder
// (AppendJSON) must match, and its path for chunks with usage or logprobs.
func (c ChatCompletionChunk) marshalReflect() ([]byte, error) {
	if c.Choices == nil {
		c.Choices = []ChunkChoice{}
	}
	for i := range c.Choices {
		c.Choices[i].Logprobs = nullIfEmpty(c.Choices[i].Logprobs)
	}
	if c.IncludeUsage || c.Usage != nil {
		type plain ChatCompletionChunk
		return json.Marshal(plain(c))
	}
	type noUsage struct {
		ID                string        `json:"id"`
		Object            string        `json:"object"`
		Created           int64         `json:"created"`
		Model             string        `json:"model"`
		SystemFingerprint string        `json:"system_fingerprint,omitempty"`
		Choices           []ChunkChoice `json:"choices"`
	}
	return json.Marshal(noUsage{c.ID, c.Object, c.Created, c.Model, c.SystemFingerprint, c.Choices})
}

// Completion is a non-streamed text completion response.
type Completion struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	Created           int64              `json:"created"`
	Model             string             `json:"model"`
	SystemFingerprint string             `json:"system_fingerprint,omitempty"`
	Choices           []CompletionChoice `json:"choices"`
	Usage             *Usage             `json:"usage,omitempty"`
}

// CompletionChoice is one choice of a Completion or CompletionChunk. FinishReason is null
// until the last chunk of a stream.
type CompletionChoice struct {
	Text         string          `json:"text"`
	Index        int             `json:"index"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
}

// MarshalJSON keeps choices an array and logprobs null.
func (c Completion) MarshalJSON() ([]byte, error) {
	type plain Completion
	c.Choices = fixCompletionChoices(c.Choices)
	return json.Marshal(plain(c))
}

// CompletionChunk is one event of a streamed text completion, with the usage rule of
// ChatCompletionChunk.
type CompletionChunk struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	Created           int64              `json:"created"`
	Model             string             `json:"model"`
	SystemFingerprint string             `json:"system_fingerprint,omitempty"`
	Choices           []CompletionChoice `json:"choices"`
	Usage             *Usage             `json:"usage"`
	IncludeUsage      bool               `json:"-"`
}

// MarshalJSON applies the usage rule.
func (c CompletionChunk) MarshalJSON() ([]byte, error) {
	c.Choices = fixCompletionChoices(c.Choices)
	if c.IncludeUsage || c.Usage != nil {
		type plain CompletionChunk
		return json.Marshal(plain(c))
	}
	type noUsage struct {
		ID                string             `json:"id"`
		Object            string             `json:"object"`
		Created           int64              `json:"created"`
		Model             string             `json:"model"`
		SystemFingerprint string             `json:"system_fingerprint,omitempty"`
		Choices           []CompletionChoice `json:"choices"`
	}
	return json.Marshal(noUsage{c.ID, c.Object, c.Created, c.Model, c.SystemFingerprint, c.Choices})
}

func fixCompletionChoices(cs []CompletionChoice) []CompletionChoice {
	if cs == nil {
		return []CompletionChoice{}
	}
	out := make([]CompletionChoice, len(cs))
	copy(out, cs)
	for i := range out {
		out[i].Logprobs = nullIfEmpty(out[i].Logprobs)
	}
	return out
}

func nullIfEmpty(b json.RawMessage) json.RawMessage {
	if len(b) == 0 {
		return json.RawMessage("null")
	}
	return b
}

// ModelList is the body of GET /v1/models.
type ModelList struct {
	Object string  `json:"object"`
	Data   []Model `json:"data"`
}

// Model is one entry of a ModelList. MaxModelLen, Root and Parent are extensions some engines
// (vLLM) send: the context window in tokens (0 unknown), where the model or adapter was
// loaded from, and for a LoRA adapter the base model it runs on; each left out when unknown
// or empty.
type Model struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	Created     int64  `json:"created"`
	OwnedBy     string `json:"owned_by"`
	MaxModelLen int    `json:"max_model_len,omitempty"`
	Root        string `json:"root,omitempty"`
	Parent      string `json:"parent,omitempty"`
}

// StringPtr returns &s, for Delta.Content, ResponseMessage.Content and finish reasons.
func StringPtr(s string) *string { return &s }
