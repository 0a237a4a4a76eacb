package external

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"

	"github.com/kvmesh/kvmesh/node/engine"

	wire "github.com/kvmesh/kvmesh/node/openai"
)

// ForceStreaming returns the body to send the engine: req.Body with "stream": true and
// "stream_options": {"include_usage": true}, and not one other byte changed. The client's
// fields reach the engine exactly as sent, the ones kvmesh reads and the ones it does not (an
// engine's own sampling or structured-output fields) alike, in their order, spacing and
// escaping: the values of stream and of stream_options.include_usage are replaced where they
// stand (every occurrence), a stream_options that is not an object is replaced by one, and a
// member that is missing is added before the closing brace. An empty Body is built from the
// request's Model, Prompt, MaxTokens and Stop (chat as one user message).
func ForceStreaming(req *engine.Request) ([]byte, error) {
	body := bytes.TrimSpace(req.Body)
	if len(body) == 0 {
		return synthesise(req)
	}
	return edit(body, streaming()...)
}

// streaming is ForceStreaming's edits.
func streaming() []wire.Edit {
	return []wire.Edit{
		{Name: "stream", Value: constant("true"), Add: true},
		{Name: "stream_options", Add: true, Value: func(v []byte) []byte {
			if len(v) == 0 || v[0] != '{' { // absent, null or not an object: the engine must report usage
				return []byte(`{"include_usage":true}`)
			}
			o, err := wire.SetMember(v, "include_usage", constant("true"))
			if err != nil { // unreachable: v is a valid object
				return []byte(`{"include_usage":true}`)
			}
			return o
		}},
	}
}

// SetPriority returns body (a JSON object, as ForceStreaming makes it) with vLLM's request
// priority set to kvmesh's priority p: "priority": -p, since vLLM handles a lower value
// earlier (default 0) and kvmesh a higher one. Like ForceStreaming it changes no other byte:
// a client's own priority member is replaced where it stands (every occurrence), so the
// priority the node admitted the request at, after its key's cap, is the one the engine
// schedules by; a body without one gets the member before its closing brace.
func SetPriority(body []byte, p int) ([]byte, error) { return edit(body, priority(true, p)) }

// dropPriority returns body (a JSON object) without its priority members, every other byte
// as sent. Priority is the node's: vLLM started with --scheduling-policy priority (or SGLang
// with --enable-priority-scheduling) would otherwise run a client's "priority": -1000 ahead of
// every request kvmesh ranked higher, past its key's max_priority.
func dropPriority(body []byte) ([]byte, error) { return edit(body, priority(false, 0)) }

// priority is SetPriority's edit with set, dropPriority's without.
func priority(set bool, p int) wire.Edit {
	if !set {
		return wire.Edit{Name: "priority"}
	}
	return wire.Edit{Name: "priority", Value: constant(strconv.Itoa(-p)), Add: true}
}

// setMaxTokens returns body (a JSON object) capped at n output tokens, the max_tokens
// admission decided (the client's, clamped, or the default it filled in): the KV reserved and
// the tokens charged to the key hold for n, and vLLM without a cap generates to the end of
// the context. Each cap member the client sent (max_tokens, max_completion_tokens, and
// llama.cpp's n_predict, which it prefers to max_tokens) keeps a whole value of 1 to n where it
// stands (written as an integer: 3.0 is 3) and is set to n otherwise; a min_tokens over n is
// lowered to n, which vLLM would otherwise refuse as over max_tokens; with add, a body without
// max_tokens gets "max_tokens": n, beside a max_completion_tokens, for engines that read only
// max_tokens. Every other byte is as sent.
func setMaxTokens(body []byte, n int, add bool) ([]byte, error) {
	return edit(body, outputCap(n, add)...)
}

// outputCap is setMaxTokens's edits.
func outputCap(n int, add bool) []wire.Edit {
	v := []byte(strconv.Itoa(n))
	capped := func(old []byte) []byte {
		if c, err := strconv.ParseFloat(string(old), 64); err == nil && c == math.Trunc(c) && c >= 1 && c <= float64(n) {
			return []byte(strconv.Itoa(int(c)))
		}
		return v // absent, null, not a number, or past n
	}
	return []wire.Edit{
		{Name: "max_tokens", Value: capped, Add: add},
		{Name: "max_completion_tokens", Value: capped},
		{Name: "n_predict", Value: capped},
		{Name: "min_tokens", Value: func(old []byte) []byte {
			if c, err := strconv.ParseFloat(string(old), 64); err == nil && c > float64(n) {
				return v
			}
			return old
		}},
	}
}

// edit makes edits to body, a JSON object, in one pass.
func edit(body []byte, edits ...wire.Edit) ([]byte, error) {
	out, err := wire.EditObject(bytes.TrimSpace(body), edits...)
	if err != nil {
		return nil, fmt.Errorf("external: request body is not a JSON object: %w", engine.ErrRejected)
	}
	return out, nil
}

func constant(v string) func([]byte) []byte { return func([]byte) []byte { return []byte(v) } }

// synthesise builds a body for a request that came without one.
func synthesise(req *engine.Request) ([]byte, error) {
	obj := map[string]any{"model": req.Model, "stream": true, "stream_options": map[string]bool{"include_usage": true}}
	if req.Endpoint == engine.Completion {
		obj["prompt"] = string(req.Prompt)
	} else {
		obj["messages"] = []map[string]string{{"role": "user", "content": string(req.Prompt)}}
	}
	if req.MaxTokens > 0 {
		obj["max_tokens"] = req.MaxTokens
	}
	if len(req.Stop) > 0 {
		obj["stop"] = req.Stop
	}
	out, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("external: encoding body: %w", err)
	}
	return out, nil
}
