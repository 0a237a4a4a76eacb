package external

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/kvmesh/kvmesh/node/engine"
	wire "github.com/kvmesh/kvmesh/node/openai"
)

// stream turns the engine's SSE chunks into engine.Chunks. The finishing chunk is held back
// until the usage chunk after it arrives, so the last engine.Chunk carries both.
type stream struct {
	ctx     context.Context
	cancel  context.CancelFunc
	body    io.Closer
	sse     *wire.SSEReader
	onClose func()

	pending *engine.Chunk
	usage   *engine.Usage
	done    bool
	once    sync.Once

	// cachedReported: the usage had prompt_tokens_details (residency.go corrects on it).
	cachedReported bool
}

// sseChunk covers both chat and completion chunks: only choice 0 is read (kvmesh forwards n=1).
type sseChunk struct {
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Content   *string         `json:"content"`
			ToolCalls []wire.ToolCall `json:"tool_calls"`
		} `json:"delta"`
		Text         *string         `json:"text"`
		Logprobs     json.RawMessage `json:"logprobs"`
		FinishReason *string         `json:"finish_reason"`
	} `json:"choices"`
	Usage *wire.Usage     `json:"usage"`
	Error json.RawMessage `json:"error"`
}

func (s *stream) Recv() (engine.Chunk, error) {
	if s.done {
		return engine.Chunk{}, io.EOF
	}
	for {
		data, err := s.sse.Next()
		if err != nil {
			return s.endOfInput(err)
		}
		var c sseChunk
		if err := json.Unmarshal(data, &c); err != nil {
			s.finish()
			return engine.Chunk{}, fmt.Errorf("external: bad chunk from engine: %w", err)
		}
		if len(c.Error) > 0 && string(c.Error) != "null" {
			s.finish()
			var d wire.ErrorDetail
			if json.Unmarshal(c.Error, &d) != nil || d.Message == "" {
				d.Message = string(c.Error)
			}
			return engine.Chunk{}, fmt.Errorf("%w: %s", ErrStream, d.Message)
		}
		if c.Usage != nil {
			u := &engine.Usage{PromptTokens: c.Usage.PromptTokens, CompletionTokens: c.Usage.CompletionTokens}
			if c.Usage.PromptTokensDetails != nil {
				u.CachedTokens = c.Usage.PromptTokensDetails.CachedTokens
				s.cachedReported = true
			}
			s.usage = u
		}
		var text, reason string
		var lps []engine.Logprob
		var calls []engine.ToolCall
		for _, ch := range c.Choices {
			if ch.Index != 0 {
				continue
			}
			if ch.Delta.Content != nil {
				text += *ch.Delta.Content
			}
			calls = appendCalls(calls, ch.Delta.ToolCalls)
			if ch.Text != nil {
				text += *ch.Text
			}
			lps = append(lps, parseLogprobs(ch.Logprobs)...)
			if ch.FinishReason != nil {
				reason = *ch.FinishReason
			}
		}
		switch {
		case reason != "":
			s.pending = &engine.Chunk{Text: text, FinishReason: reason, Logprobs: lps, ToolCalls: calls}
			if s.usage != nil {
				return s.emitPending(), nil
			}
		case s.pending != nil:
			s.pending.Text += text
			s.pending.Logprobs = append(s.pending.Logprobs, lps...)
			s.pending.ToolCalls = append(s.pending.ToolCalls, calls...)
			if s.usage != nil {
				return s.emitPending(), nil
			}
		case text != "" || len(lps) > 0 || len(calls) > 0:
			return engine.Chunk{Text: text, Logprobs: lps, ToolCalls: calls}, nil
		}
	}
}

// appendCalls appends the engine's tool call pieces to dst. A piece without an index is the
// call after the previous piece's (some engines send whole calls in one chunk without one).
func appendCalls(dst []engine.ToolCall, calls []wire.ToolCall) []engine.ToolCall {
	for i, tc := range calls {
		idx := i
		if tc.Index != nil {
			idx = *tc.Index
		}
		dst = append(dst, engine.ToolCall{Index: idx, ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
	}
	return dst
}

func (s *stream) emitPending() engine.Chunk {
	c := *s.pending
	c.Usage = s.usage
	s.finish()
	return c
}

// endOfInput handles the end of the SSE input: a held finish chunk is still a complete answer
// (some engines send no usage chunk); anything else is a truncated stream.
func (s *stream) endOfInput(err error) (engine.Chunk, error) {
	if s.ctx.Err() != nil {
		s.finish()
		return engine.Chunk{}, fmt.Errorf("external: stream cancelled: %w", context.Cause(s.ctx))
	}
	if s.pending != nil && (err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF)) {
		return s.emitPending(), nil
	}
	s.finish()
	if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
		return engine.Chunk{}, ErrTruncated
	}
	return engine.Chunk{}, fmt.Errorf("external: reading engine stream: %w", err)
}

func (s *stream) finish() {
	s.done = true
	s.release()
}

func (s *stream) release() {
	s.once.Do(func() {
		s.cancel()
		s.body.Close()
		s.onClose()
	})
}

// Close cancels the upstream request; safe twice and after io.EOF.
func (s *stream) Close() error {
	s.release()
	return nil
}

// sseLogprobs is a choice's logprobs in either API's shape: chat's content entries, or the
// completions API's parallel arrays.
type sseLogprobs struct {
	Content []struct {
		Token       string  `json:"token"`
		Logprob     float64 `json:"logprob"`
		TopLogprobs []struct {
			Token   string  `json:"token"`
			Logprob float64 `json:"logprob"`
		} `json:"top_logprobs"`
	} `json:"content"`
	Tokens        []string      `json:"tokens"`
	TokenLogprobs []*float64    `json:"token_logprobs"`
	TopLogprobs   []wire.TopMap `json:"top_logprobs"`
}

// parseLogprobs reads a chunk choice's logprobs (nil for null or a shape it does not know, which
// leaves the text to stand alone rather than failing the generation).
func parseLogprobs(raw json.RawMessage) []engine.Logprob {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var l sseLogprobs
	if json.Unmarshal(raw, &l) != nil {
		return nil
	}
	var out []engine.Logprob
	for _, c := range l.Content {
		lp := engine.Logprob{Token: c.Token, Logprob: c.Logprob}
		for _, e := range c.TopLogprobs {
			lp.Top = append(lp.Top, engine.TopLogprob{Token: e.Token, Logprob: e.Logprob})
		}
		out = append(out, lp)
	}
	for i, tok := range l.Tokens {
		lp := engine.Logprob{Token: tok, Unscored: true}
		if i < len(l.TokenLogprobs) && l.TokenLogprobs[i] != nil {
			lp.Logprob, lp.Unscored = *l.TokenLogprobs[i], false
		}
		if i < len(l.TopLogprobs) {
			for _, e := range l.TopLogprobs[i] {
				lp.Top = append(lp.Top, engine.TopLogprob{Token: e.Token, Logprob: e.Logprob})
			}
		}
		out = append(out, lp)
	}
	return out
}
