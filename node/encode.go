package node

import (
	"cmp"
	"encoding/json"
	"net/http"
	"time"

	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/openai"
)

// encoder turns engine chunks into the OpenAI objects of one request's endpoint.
type encoder struct {
	p       *prepared
	id      string
	created int64
}

func newEncoder(p *prepared, now time.Time) *encoder {
	prefix := "chatcmpl-"
	if p.endpoint == engine.Completion {
		prefix = "cmpl-"
	}
	return &encoder{p: p, id: prefix + p.req.ID, created: now.Unix()}
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

// roleChunk opens a chat stream (the assistant role, no content); completions have none.
func (e *encoder) roleChunk() any {
	if e.p.endpoint == engine.Completion {
		return nil
	}
	return openai.ChatCompletionChunk{
		ID: e.id, Object: openai.ObjectChatCompletionChunk, Created: e.created, Model: e.p.model.Name,
		Choices:      []openai.ChunkChoice{{Delta: openai.Delta{Role: "assistant", Content: openai.StringPtr("")}}},
		IncludeUsage: e.p.includeUsage,
	}
}

// chunk is one streamed piece of text, or the finishing piece (text may ride along with it).
func (e *encoder) chunk(c engine.Chunk) any {
	if e.p.endpoint == engine.Completion {
		return openai.CompletionChunk{
			ID: e.id, Object: openai.ObjectTextCompletion, Created: e.created, Model: e.p.model.Name,
			Choices:      []openai.CompletionChoice{{Text: c.Text, FinishReason: finishOf(c)}},
			IncludeUsage: e.p.includeUsage,
		}
	}
	var d openai.Delta
	if c.Text != "" {
		d.Content = openai.StringPtr(c.Text)
	}
	d.ToolCalls = deltaCalls(c.ToolCalls)
	return openai.ChatCompletionChunk{
		ID: e.id, Object: openai.ObjectChatCompletionChunk, Created: e.created, Model: e.p.model.Name,
		Choices:      []openai.ChunkChoice{{Delta: d, FinishReason: finishOf(c)}},
		IncludeUsage: e.p.includeUsage,
	}
}

// usageChunk is the final chunk of a stream that asked for usage: no choices, only usage.
func (e *encoder) usageChunk(u *engine.Usage) any {
	if e.p.endpoint == engine.Completion {
		return openai.CompletionChunk{
			ID: e.id, Object: openai.ObjectTextCompletion, Created: e.created, Model: e.p.model.Name,
			Choices: []openai.CompletionChoice{}, Usage: usageOf(u), IncludeUsage: true,
		}
	}
	return openai.ChatCompletionChunk{
		ID: e.id, Object: openai.ObjectChatCompletionChunk, Created: e.created, Model: e.p.model.Name,
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

// callJoiner puts a generation's tool call pieces together into whole calls, in index order.
type callJoiner struct {
	calls []openai.ToolCall
	at    map[int]int // a call's index to its place in calls
}

func (j *callJoiner) add(pieces []engine.ToolCall) {
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

// complete is the non-streaming response; calls are its tool calls, whole.
func (e *encoder) complete(text string, last engine.Chunk, calls []openai.ToolCall) any {
	if e.p.endpoint == engine.Completion {
		return openai.Completion{
			ID: e.id, Object: openai.ObjectTextCompletion, Created: e.created, Model: e.p.model.Name,
			Choices: []openai.CompletionChoice{{Text: text, FinishReason: finishOf(last)}},
			Usage:   usageOf(last.Usage),
		}
	}
	msg := openai.ResponseMessage{Role: "assistant", Content: &text, ToolCalls: calls}
	if text == "" && len(calls) > 0 {
		msg.Content = nil
	}
	return openai.ChatCompletion{
		ID: e.id, Object: openai.ObjectChatCompletion, Created: e.created, Model: e.p.model.Name,
		Choices: []openai.ChatChoice{{Message: msg, FinishReason: last.FinishReason}},
		Usage:   usageOf(last.Usage),
	}
}

// modelObject is OpenAI's model object for m, with vLLM's max_model_len.
func modelObject(m engine.Model) openai.Model {
	return openai.Model{ID: m.Name, Object: openai.ObjectModel, Created: 0, OwnedBy: "kvmesh", MaxModelLen: m.ContextTokens,
		Root: m.Root, Parent: m.Parent}
}

// handleModels is GET /v1/models: every model served in the mesh this node sees.
func (n *Node) handleModels(w http.ResponseWriter, r *http.Request) {
	list := openai.ModelList{Object: "list", Data: []openai.Model{}}
	for _, m := range n.meshModels() {
		list.Data = append(list.Data, modelObject(m))
	}
	writeJSON(w, http.StatusOK, list)
}

func (n *Node) handleHealthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "node": n.cfg.Name})
}

// handleReadyz is 200 while the node is not shutting down and its engine is healthy: for an
// external engine, while it answers, serves at least one of the node's models and its metrics
// scrape works. A 503's body says why ("reason"), for an unhealthy engine when it can.
func (n *Node) handleReadyz(w http.ResponseWriter, r *http.Request) {
	switch {
	case n.unready.Load():
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": CodeDraining, "reason": "the node is shutting down"})
	case !n.eng.State().Healthy:
		body := map[string]string{"status": "engine unhealthy"}
		if n.ext != nil {
			if err := n.ext.Health(); err != nil {
				body["reason"] = err.Error()
			}
		}
		writeJSON(w, http.StatusServiceUnavailable, body)
	default:
		body := map[string]string{"status": "ready"}
		if msg := n.joinFailing(); msg != "" {
			// Ready all the same: a fleet restarting at once must serve before its seeds are back.
			body["warning"] = msg
		}
		writeJSON(w, http.StatusOK, body)
	}
}

// joinFailing says why this node serves alone while it cannot join its seeds, or "".
func (n *Node) joinFailing() string {
	if n.g == nil {
		return ""
	}
	if err := n.g.JoinFailing(); err != nil {
		return "serving alone: cannot join the seeds: " + err.Error()
	}
	return ""
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
