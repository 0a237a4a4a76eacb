package sim

import (
	"encoding/json"
	"testing"

	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/openai"
)

const weatherTools = `[{"type":"function","function":{"name":"lookup","parameters":{"type":"object"}}},` +
	`{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":` +
	`{"city":{"type":"string"},"days":{"type":"integer"},"metric":{"type":"boolean"}}}}}]`

// joinCall runs req and puts its tool call pieces together: the call's ID, name and arguments,
// how many chunks carried pieces, and the final chunk.
func joinCall(t *testing.T, s *Sim, req *engine.Request) (id, name, args string, pieces int, last engine.Chunk) {
	t.Helper()
	st, err := s.Generate(t.Context(), req)
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	for last.FinishReason == "" {
		c, err := st.Recv()
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		if c.Text != "" {
			t.Fatalf("text %q in a forced tool call's answer", c.Text)
		}
		for _, p := range c.ToolCalls {
			if p.Index != 0 || (pieces == 0) != (p.ID != "") || (pieces == 0) != (p.Name != "") {
				t.Fatalf("piece %d: %+v", pieces, p)
			}
			id, name, args = id+p.ID, name+p.Name, args+p.Arguments
			pieces++
		}
		last = c
	}
	return id, name, args, pieces, last
}

// TestForcedToolCallIsOneCallWithJSONArguments pins the embedded engine's tool calls: a
// tool_choice naming a function, or "required" (the first tool), is answered with one call to
// it whose arguments, streamed a token a piece, are a JSON object with a member of each
// parameter's type, finishing tool_calls with a token counted per piece; the same seed calls
// the same way; max_tokens cuts the arguments short with finish length.
func TestForcedToolCallIsOneCallWithJSONArguments(t *testing.T) {
	s := newTestSim(t, nil)
	named := extra("tools", weatherTools, "tool_choice", `{"type":"function","function":{"name":"get_weather"}}`)
	req := func(ex []openai.Field, maxTokens int) *engine.Request {
		return &engine.Request{Model: testModel, Prompt: prompt("tools", 16), MaxTokens: maxTokens, Seed: 7, Extra: ex}
	}
	id, name, args, pieces, last := joinCall(t, s, req(named, 64))
	var a struct {
		City   string `json:"city"`
		Days   *int   `json:"days"`
		Metric *bool  `json:"metric"`
	}
	if err := json.Unmarshal([]byte(args), &a); err != nil || a.City == "" || a.Days == nil || a.Metric == nil {
		t.Fatalf("arguments %q (%v)", args, err)
	}
	if name != "get_weather" || len(id) != len("call_")+16 || last.FinishReason != engine.FinishToolCalls ||
		last.Usage.CompletionTokens != pieces || pieces != (len(args)+3)/4 {
		t.Fatalf("call %s %s in %d pieces, finish %s, usage %+v", id, name, pieces, last.FinishReason, last.Usage)
	}
	id2, _, args2, _, _ := joinCall(t, s, req(named, 64))
	if id2 != id || args2 != args {
		t.Errorf("the same seed called %s(%s), then %s(%s)", id, args, id2, args2)
	}

	_, name, args, _, last = joinCall(t, s, req(extra("tools", weatherTools, "tool_choice", `"required"`), 64))
	if name != "lookup" || args != "{}" || last.FinishReason != engine.FinishToolCalls {
		t.Errorf("required: %s(%s), finish %s; want lookup({}), tool_calls", name, args, last.FinishReason)
	}

	_, _, args, pieces, last = joinCall(t, s, req(named, 2))
	if pieces != 2 || len(args) != 8 || last.FinishReason != engine.FinishLength {
		t.Errorf("max_tokens 2: %q in %d pieces, finish %s; want 2 pieces, length", args, pieces, last.FinishReason)
	}

	r := gen(t, s, req(extra("tools", weatherTools, "tool_choice", `"auto"`), 8))
	if r.text == "" || r.last.ToolCalls != nil || r.last.FinishReason == engine.FinishToolCalls {
		t.Errorf("tool_choice auto: %q, %+v; want text", r.text, r.last)
	}
}
