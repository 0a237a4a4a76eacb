package openai

import (
	"bytes"
	"encoding/json"
	"errors"
)

// ChatLogprobs is the logprobs of a chat choice (or of a streamed chunk's tokens): one entry per
// output token.
type ChatLogprobs struct {
	Content []TokenLogprob `json:"content"`
}

// TokenLogprob is one chat output token: its text, log probability, UTF-8 bytes, and the
// likeliest tokens at its position (top_logprobs of them, most likely first; [] for none).
type TokenLogprob struct {
	Token       string       `json:"token"`
	Logprob     float64      `json:"logprob"`
	Bytes       []int        `json:"bytes"`
	TopLogprobs []TopLogprob `json:"top_logprobs"`
}

// TopLogprob is one of the likeliest tokens at a position.
type TopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes,omitempty"`
}

// TokenBytes returns s's bytes as the JSON array of integers the chat API sends.
func TokenBytes(s string) []int {
	b := make([]int, len(s))
	for i := range len(s) {
		b[i] = int(s[i])
	}
	return b
}

// CompletionLogprobs is the logprobs of a completion choice (or chunk), as parallel arrays:
// each token, its log probability (null for the first token of an echoed prompt), the
// likeliest tokens at its position, and its byte offset in the choice's text (counted from the
// start of the whole response when streamed).
type CompletionLogprobs struct {
	Tokens        []string   `json:"tokens"`
	TokenLogprobs []*float64 `json:"token_logprobs"`
	TopLogprobs   []TopMap   `json:"top_logprobs"`
	TextOffset    []int      `json:"text_offset"`
}

// TopMap is one position's likeliest tokens as the completions API sends them: a JSON object
// from token to log probability. Its members are written in slice order (most likely first)
// and read in body order. Nil is null (the first token of an echoed prompt).
type TopMap []TopLogprob

var errTopMap = errors.New("top_logprobs entries must be objects of numbers")

// MarshalJSON writes the object in slice order.
func (m TopMap) MarshalJSON() ([]byte, error) {
	if m == nil {
		return []byte("null"), nil
	}
	b := []byte{'{'}
	for i, e := range m {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, e.Token)
		b = append(b, ':')
		v, err := json.Marshal(e.Logprob)
		if err != nil {
			return nil, err
		}
		b = append(b, v...)
	}
	return append(b, '}'), nil
}

// UnmarshalJSON reads an object of numbers (or null) keeping its members' order.
func (m *TopMap) UnmarshalJSON(b []byte) error {
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		*m = nil
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return errTopMap
	}
	out := TopMap{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return errTopMap
		}
		var lp float64
		if err := dec.Decode(&lp); err != nil {
			return errTopMap
		}
		out = append(out, TopLogprob{Token: t.(string), Logprob: lp})
	}
	*m = out
	return nil
}
