package external

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"

	"github.com/kvmesh/kvmesh/node/engine"
	wire "github.com/kvmesh/kvmesh/node/openai"
)

// The halves of a split request on vLLM servers started with a KV connector
// (--kv-transfer-config, e.g. NixlConnector), as vLLM's own proxy runs them
// (docs/design/disaggregation.md#external-engines): the prefill server gets the request with
// max_tokens 1, not streamed, and kv_transfer_params asking for a remote decode; its answer's
// kv_transfer_params are the handover (engine.Handover.Params); the decode server gets the
// client's request with them and pulls the KV itself.

// maxPrefillAnswer bounds a prefill server's answer: one token, its usage and the transfer
// parameters (logprobs of a long prompt's echo would be the largest part).
const maxPrefillAnswer = 1 << 20

// prefillBody is body (a JSON object) in a prefill server's shape, as vLLM's proxy sends it:
// kv_transfer_params asking for a remote decode, stream false, max_tokens 1 (and
// max_completion_tokens 1 when the client sent it), without stream_options, min_tokens or
// min_completion_tokens, which a one-token prefill cannot honour. Member order is not kept.
func prefillBody(body []byte) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil || m == nil {
		return nil, fmt.Errorf("external: request body is not a JSON object: %w", engine.ErrRejected)
	}
	for _, k := range []string{"stream_options", "min_tokens", "min_completion_tokens"} {
		delete(m, k)
	}
	m["kv_transfer_params"] = json.RawMessage(wire.PrefillTransferParams)
	m["stream"] = json.RawMessage("false")
	m["max_tokens"] = json.RawMessage("1")
	if _, ok := m["max_completion_tokens"]; ok {
		m["max_completion_tokens"] = json.RawMessage("1")
	}
	out, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("external: encoding the prefill body: %w", err)
	}
	return out, nil
}

// decodeBody is body with kv_transfer_params set to the prefill server's, h.Params.
func decodeBody(body []byte, h *engine.Handover) ([]byte, error) {
	if len(h.Params) == 0 {
		return nil, fmt.Errorf("external: %w: the handover carries no kv_transfer_params (another kind of engine prefilled it)",
			engine.ErrUnavailable)
	}
	out, err := wire.SetMember(body, "kv_transfer_params", func([]byte) []byte { return h.Params })
	if err != nil {
		return nil, fmt.Errorf("external: request body is not a JSON object: %w", engine.ErrRejected)
	}
	return out, nil
}

// readPrefill reads a prefill server's 200 answer to req and returns a stream of one chunk,
// FinishHandover with the handover: the answer's kv_transfer_params (a JSON object) as its
// Params, and the prompt and cached tokens of its usage (req's own count without one). An
// answer that is no JSON, or has no kv_transfer_params object (a server started without a KV
// connector answers null), is the engine's failure: it wraps engine.ErrUnavailable.
func readPrefill(r io.Reader, req *engine.Request) (engine.Stream, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxPrefillAnswer+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("external: %w: reading the prefill answer: %w", engine.ErrUnavailable, err)
	case len(b) > maxPrefillAnswer:
		return nil, fmt.Errorf("external: %w: the prefill answer is over %d bytes", engine.ErrUnavailable, maxPrefillAnswer)
	}
	var ans struct {
		Params json.RawMessage `json:"kv_transfer_params"`
		Usage  *wire.Usage     `json:"usage"`
	}
	if err := json.Unmarshal(b, &ans); err != nil {
		return nil, fmt.Errorf("external: %w: the prefill answer is not a JSON object: %w", engine.ErrUnavailable, err)
	}
	params := bytes.TrimSpace(ans.Params)
	switch {
	case len(params) == 0 || string(params) == "null":
		return nil, fmt.Errorf("external: %w: the prefill answer has no kv_transfer_params (is the server started with --kv-transfer-config?)",
			engine.ErrUnavailable)
	case params[0] != '{':
		return nil, fmt.Errorf("external: %w: the prefill answer's kv_transfer_params is not an object", engine.ErrUnavailable)
	case len(params) > engine.MaxHandoverParams:
		return nil, fmt.Errorf("external: %w: the prefill answer's kv_transfer_params is over %d bytes",
			engine.ErrUnavailable, engine.MaxHandoverParams)
	}
	h := &engine.Handover{Blocks: req.Blocks, PromptTokens: req.PromptTokens, Params: slices.Clone(params)}
	if u := ans.Usage; u != nil && u.PromptTokens > 0 {
		h.PromptTokens = u.PromptTokens
		if d := u.PromptTokensDetails; d != nil {
			h.CachedTokens = min(max(d.CachedTokens, 0), u.PromptTokens)
		}
	}
	return &doneStream{c: engine.Chunk{FinishReason: engine.FinishHandover, Handover: h,
		Usage: &engine.Usage{PromptTokens: h.PromptTokens, CachedTokens: h.CachedTokens}}}, nil
}

// doneStream is a stream whose one chunk is known already.
type doneStream struct {
	c    engine.Chunk
	sent bool
}

func (s *doneStream) Recv() (engine.Chunk, error) {
	if s.sent {
		return engine.Chunk{}, io.EOF
	}
	s.sent = true
	return s.c, nil
}

func (s *doneStream) Close() error { return nil }
