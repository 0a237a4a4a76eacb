package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// MaxEmbeddingInputs bounds the inputs of one embeddings request (OpenAI's own limit).
const MaxEmbeddingInputs = 2048

// Embedding encodings: the float array, or base64 of its little-endian float32 bytes.
const (
	EncodingFloat  = "float"
	EncodingBase64 = "base64"
)

// EmbeddingsRequest is the body of POST /v1/embeddings, read as ChatRequest is: typed fields
// for what kvmesh reads, Extra for the rest (vLLM's truncate_prompt_tokens, ...).
type EmbeddingsRequest struct {
	Model          string          `json:"model"`
	Input          *EmbeddingInput `json:"input"`
	EncodingFormat *string         `json:"encoding_format,omitempty"`
	Dimensions     *int            `json:"dimensions,omitempty"`
	User           string          `json:"user,omitempty"`
	Extra          Fields          `json:"-"`
}

func (r *EmbeddingsRequest) member(name string) any {
	switch name {
	case "model":
		return &r.Model
	case "input":
		return &r.Input
	case "encoding_format":
		return &r.EncodingFormat
	case "dimensions":
		return integer(&r.Dimensions)
	case "user":
		return &r.User
	}
	return nil
}

// MarshalJSON writes the typed fields, then Extra's members.
func (r EmbeddingsRequest) MarshalJSON() ([]byte, error) {
	type plain EmbeddingsRequest
	b, err := json.Marshal(plain(r))
	if err != nil {
		return nil, err
	}
	return r.Extra.appendTo(b), nil
}

// EmbeddingInput is an embeddings request's input: a string, an array of strings, an array of
// token ids (one input), or an array of arrays of token ids. Exactly one of Texts and Tokens
// is set.
type EmbeddingInput struct {
	Texts  []string
	Tokens [][]int
}

var errInput = errors.New("must be a non-empty string, a non-empty array of non-empty strings, " +
	"or a non-empty array of token ids or of arrays of token ids")

// UnmarshalJSON accepts the four shapes OpenAI's API does, and nothing empty.
func (in *EmbeddingInput) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil || s == "" {
			return errInput
		}
		in.Texts = []string{s}
		return nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(b, &items); err != nil || len(items) == 0 {
		return errInput
	}
	if len(items) > MaxEmbeddingInputs {
		return fmt.Errorf("has %d items (at most %d)", len(items), MaxEmbeddingInputs)
	}
	switch first := bytes.TrimSpace(items[0]); {
	case len(first) > 0 && first[0] == '"':
		in.Texts = make([]string, len(items))
		for i, it := range items {
			if err := json.Unmarshal(it, &in.Texts[i]); err != nil || in.Texts[i] == "" {
				return errInput
			}
		}
	case len(first) > 0 && first[0] == '[':
		in.Tokens = make([][]int, len(items))
		for i, it := range items {
			if err := json.Unmarshal(it, &in.Tokens[i]); err != nil || !validTokens(in.Tokens[i]) {
				return errInput
			}
		}
	default:
		var ids []int
		if err := json.Unmarshal(b, &ids); err != nil || !validTokens(ids) {
			return errInput
		}
		in.Tokens = [][]int{ids}
	}
	return nil
}

func validTokens(ids []int) bool {
	if len(ids) == 0 {
		return false
	}
	for _, id := range ids {
		if id < 0 {
			return false
		}
	}
	return true
}

// MarshalJSON writes the input as an array of strings or of token-id arrays.
func (in EmbeddingInput) MarshalJSON() ([]byte, error) {
	if in.Tokens != nil {
		return json.Marshal(in.Tokens)
	}
	return json.Marshal(in.Texts)
}

// Len is the number of inputs.
func (in *EmbeddingInput) Len() int { return len(in.Texts) + len(in.Tokens) }

// DecodeEmbeddings reads and validates an embeddings body of at most limit bytes, like
// DecodeChat: model and input are required, encoding_format is float or base64, dimensions is
// at least 1 (its upper bound is the engine's).
func DecodeEmbeddings(r io.Reader, limit int64) (*EmbeddingsRequest, *Error) {
	var req EmbeddingsRequest
	if err := decodeBody(r, limit, req.member, &req.Extra); err != nil {
		return nil, err
	}
	switch {
	case req.Model == "":
		return nil, ErrInvalidParameter("model", "model is required")
	case req.Input == nil:
		return nil, ErrInvalidParameter("input", "input is required")
	case req.EncodingFormat != nil && *req.EncodingFormat != EncodingFloat && *req.EncodingFormat != EncodingBase64:
		return nil, ErrInvalidParameter("encoding_format", `encoding_format must be "float" or "base64"`)
	case req.Dimensions != nil && *req.Dimensions < 1:
		return nil, ErrInvalidParameter("dimensions", "dimensions must be at least 1")
	}
	return &req, nil
}

// Embeddings is the response of POST /v1/embeddings.
type Embeddings struct {
	Object string          `json:"object"` // "list"
	Data   []Embedding     `json:"data"`
	Model  string          `json:"model"`
	Usage  EmbeddingsUsage `json:"usage"`
}

// Embedding is one input's vector: Vector as a float array, or Base64 when the request asked
// for encoding_format base64.
type Embedding struct {
	Object string    `json:"object"` // "embedding"
	Index  int       `json:"index"`
	Vector []float32 `json:"-"`
	Base64 string    `json:"-"`
}

// MarshalJSON writes the vector under "embedding", as an array or a base64 string.
func (e Embedding) MarshalJSON() ([]byte, error) {
	var v any = e.Vector
	if e.Base64 != "" {
		v = e.Base64
	}
	return json.Marshal(struct {
		Object    string `json:"object"`
		Index     int    `json:"index"`
		Embedding any    `json:"embedding"`
	}{e.Object, e.Index, v})
}

// EmbeddingsUsage counts an embeddings request's input tokens.
type EmbeddingsUsage struct {
	PromptTokens int `json:"prompt_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

// ResponsesRequest is the body of POST /v1/responses as kvmesh reads it: the model, the
// response it continues, whether it streams and its output cap; the rest (input,
// instructions, tools, ...) is the engine's, in Extra.
type ResponsesRequest struct {
	Model              string  `json:"model"`
	PreviousResponseID *string `json:"previous_response_id,omitempty"`
	Stream             *bool   `json:"stream,omitempty"`
	MaxOutputTokens    *int    `json:"max_output_tokens,omitempty"`
	Extra              Fields  `json:"-"`
}

func (r *ResponsesRequest) member(name string) any {
	switch name {
	case "model":
		return &r.Model
	case "previous_response_id":
		return &r.PreviousResponseID
	case "stream":
		return &r.Stream
	case "max_output_tokens":
		return integer(&r.MaxOutputTokens)
	}
	return nil
}

// DecodeResponses reads and validates a Responses API body of at most limit bytes, like
// DecodeChat: model is required, previous_response_id is a non-empty string when given and
// max_output_tokens at least 1.
func DecodeResponses(r io.Reader, limit int64) (*ResponsesRequest, *Error) {
	var req ResponsesRequest
	if err := decodeBody(r, limit, req.member, &req.Extra); err != nil {
		return nil, err
	}
	switch {
	case req.Model == "":
		return nil, ErrInvalidParameter("model", "model is required")
	case req.PreviousResponseID != nil && *req.PreviousResponseID == "":
		return nil, ErrInvalidParameter("previous_response_id", "previous_response_id must not be empty")
	case req.MaxOutputTokens != nil && *req.MaxOutputTokens < 1:
		return nil, ErrInvalidParameter("max_output_tokens", "max_output_tokens must be at least 1")
	}
	return &req, nil
}

// MarshalJSON writes the typed fields, then Extra's members.
func (r ResponsesRequest) MarshalJSON() ([]byte, error) {
	type plain ResponsesRequest
	b, err := json.Marshal(plain(r))
	if err != nil {
		return nil, err
	}
	return r.Extra.appendTo(b), nil
}
