package render

import (
	"cmp"
	"time"

	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/openai"
)

// Encoder turns engine chunks into the OpenAI objects of one request's endpoint.
type Encoder struct {
	completion   bool
	id           string
	created      int64
	model        string
	includeUsage bool
}

// New returns the Encoder of request requestID on endpoint ep for model, whose objects carry
// the creation time now; includeUsage is the stream's stream_options.include_usage.
func New(ep engine.Endpoint, requestID, model string, includeUsage bool, now time.Time) *Encoder {
	prefix := "chatcmpl-"
	if ep == engine.Completion {
		prefix = "cmpl-"
	}
	return &Encoder{completion: ep == engine.Completion, id: prefix + requestID, created: now.Unix(), model: model,
		includeUsage: includeUsage}
}

func usageOf(u *engine.Usage) *openai.Usage {
	if u == nil {
		return nil
	}
	return openai.NewUsage(u.PromptTokens, u.CompletionTokens, u.CachedTokens)
}

func finishOf(c engine.Chunk) *string {
	if c.FinishReason == "" {
		return nil
	}
	return openai.StringPtr(c.FinishReason)
}

// RoleChunk opens a chat stream (the assistant role, no content); completions have none (nil).
func (e *Encoder) RoleChunk() any {
	if e.completion {
		return nil
	}
	return openai.ChatCompletionChunk{
		ID: e.id, Object: openai.ObjectChatCompletionChunk, Created: e.created, Model: e.model,
		Choices:      []openai.ChunkChoice{{Delta: openai.Delta{Role: "assistant", Content: openai.StringPtr("")}}},
		IncludeUsage: e.includeUsage,
	}
}

// Chunk is one streamed piece of text, or the finishing piece (text may ride along with it).
func (e *Encoder) Chunk(c engine.Chunk) any {
	if e.completion {
		return openai.CompletionChunk{
			ID: e.id, Object: openai.ObjectTextCompletion, Created: e.created, Model: e.model,
			Choices:      []openai.CompletionChoice{{Text: c.Text, FinishReason: finishOf(c)}},
			IncludeUsage: e.includeUsage,
		}
	}
	var d openai.Delta
	if c.Text != "" {
		d.Content = openai.StringPtr(c.Text)
	}
	d.ToolCalls = deltaCalls(c.ToolCalls)
	return openai.ChatCompletionChunk{
		ID: e.id, Object: openai.ObjectChatCompletionChunk, Created: e.created, Model: e.model,
		Choices:      []openai.ChunkChoice{{Delta: d, FinishReason: finishOf(c)}},
		IncludeUsage: e.includeUsage,
	}
}

// UsageChunk is the final chunk of a stream that asked for usage: no choices, only usage.
func (e *Encoder) UsageChunk(u *engine.Usage) any {
	if e.completion {
		return openai.CompletionChunk{
			ID: e.id, Object: openai.ObjectTextCompletion, Created: e.created, Model: e.model,
			Choices: []openai.CompletionChoice{}, Usage: usageOf(u), IncludeUsage: true,
		}
	}
	return openai.ChatCompletionChunk{
		ID: e.id, Object: openai.ObjectChatCompletionChunk, Created: e.created, Model: e.model,
		Choices: []openai.ChunkChoice{}, Usage: usageOf(u), IncludeUsage: true,
	}
}

// deltaCalls are a chunk's tool call pieces as a chat delta's: the type rides with the ID, on
// a call's first piece.
func deltaCalls(calls []engine.ToolCall) []openai.ToolCall {
	if len(calls) == 0 {
		return nil
	}
	out := make([]openai.ToolCall, len(calls))
	for i, c := range calls {
		out[i] = openai.ToolCall{Index: &c.Index, ID: c.ID, Function: openai.FunctionCall{Name: c.Name, Arguments: c.Arguments}}
		if c.ID != "" {
			out[i].Type = openai.ToolTypeFunction
		}
	}
	return out
}

// CallJoiner puts a generation's tool call pieces together into whole calls, in index order.
type CallJoiner struct {
	calls []openai.ToolCall
	at    map[int]int // a call's index to its place in calls
}

// Add joins pieces to the calls they continue, or starts new calls.
func (j *CallJoiner) Add(pieces []engine.ToolCall) {
	for _, p := range pieces {
		k, ok := j.at[p.Index]
		if !ok {
			if j.at == nil {
				j.at = map[int]int{}
			}
			k = len(j.calls)
			j.at[p.Index] = k
			j.calls = append(j.calls, openai.ToolCall{Type: openai.ToolTypeFunction})
		}
		c := &j.calls[k]
		c.ID = cmp.Or(c.ID, p.ID)
		c.Function.Name = cmp.Or(c.Function.Name, p.Name)
		c.Function.Arguments += p.Arguments
	}
}

// Calls are the whole calls joined so far.
func (j *CallJoiner) Calls() []openai.ToolCall { return j.calls }

// Complete is the non-streaming response: the whole text, its tool calls (whole) and the
// finishing chunk last.
func (e *Encoder) Complete(text string, last engine.Chunk, calls []openai.ToolCall) any {
	if e.completion {
		return openai.Completion{
			ID: e.id, Object: openai.ObjectTextCompletion, Created: e.created, Model: e.model,
			Choices: []openai.CompletionChoice{{Text: text, FinishReason: finishOf(last)}},
			Usage:   usageOf(last.Usage),
		}
	}
	msg := openai.ResponseMessage{Role: "assistant", Content: &text, ToolCalls: calls}
	if text == "" && len(calls) > 0 {
		msg.Content = nil
	}
	return openai.ChatCompletion{
		ID: e.id, Object: openai.ObjectChatCompletion, Created: e.created, Model: e.model,
		Choices: []openai.ChatChoice{{Message: msg, FinishReason: last.FinishReason}},
		Usage:   usageOf(last.Usage),
	}
}

// Model is OpenAI's model object for m, with vLLM's max_model_len.
func Model(m engine.Model) openai.Model {
	return openai.Model{ID: m.Name, Object: openai.ObjectModel, Created: 0, OwnedBy: "kvmesh", MaxModelLen: m.ContextTokens,
		Root: m.Root, Parent: m.Parent}
}
