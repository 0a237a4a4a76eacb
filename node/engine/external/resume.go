package external

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/kvmesh/kvmesh/node/engine"

	wire "github.com/kvmesh/kvmesh/node/openai"
)

// A continuation (engine.Request.Resume) reaches the server as the node built it: a
// completion's prompt ends with the text already sent, and a chat's messages end with an
// assistant message holding it. Each kind is told, its own way, to continue that message
// rather than answer it with a new turn (continueBody), and the usage the server reports for
// the continuation is turned into the whole generation's (resumedStream).

// continueBody returns body, as ForceStreaming made it, for a continuation r on a server of
// kind: for chat, vLLM's "continue_final_message": true with "add_generation_prompt": false
// (vLLM refuses the first without the second), SGLang's and TGI's "continue_final_message":
// true; llama.cpp's server continues a final assistant message by default (its assistant
// prefill), and a plain OpenAI-compatible server is sent no flag, having none. A min_tokens
// the client set counts the tokens sent before, since the server counts only its own.
func continueBody(kind string, ep engine.Endpoint, body []byte, r *engine.Resume) ([]byte, error) {
	var err error
	set := func(key, v string) {
		if err == nil {
			body, err = wire.SetMember(body, key, func([]byte) []byte { return []byte(v) })
		}
	}
	if ep == engine.Chat {
		switch kind {
		case KindVLLM:
			set("continue_final_message", "true")
			set("add_generation_prompt", "false")
		case KindSGLang, KindTGI:
			set("continue_final_message", "true")
		}
	}
	var m struct {
		MinTokens *int `json:"min_tokens"`
	}
	if json.Unmarshal(body, &m) == nil && m.MinTokens != nil && *m.MinTokens > 0 {
		set("min_tokens", strconv.Itoa(max(*m.MinTokens-r.Tokens, 0)))
	}
	if err != nil {
		return nil, fmt.Errorf("external: request body is not a JSON object: %w", engine.ErrRejected)
	}
	return body, nil
}

// resumedStream reports a continuation's usage as the whole generation's: the tokens sent
// before are added to the completion, and taken off the prompt, which holds them as text
// (the server counts them in its own tokens; the node's count of chunks stands in).
type resumedStream struct {
	engine.Stream
	r *engine.Resume
}

func (s *resumedStream) Recv() (engine.Chunk, error) {
	c, err := s.Stream.Recv()
	if err == nil && c.Usage != nil {
		u := *c.Usage
		u.CompletionTokens += s.r.Tokens
		u.PromptTokens = max(u.PromptTokens-s.r.Tokens, 0)
		u.CachedTokens = min(u.CachedTokens, u.PromptTokens)
		c.Usage = &u
	}
	return c, err
}
