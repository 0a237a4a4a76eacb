package journey

import (
	"encoding/json"
	"testing"

	"github.com/kvmesh/kvmesh/node/engine"
)

// TestContinuationBody pins the continuation of a request after text: chat's messages end with
// an assistant message holding it, completions' prompt with the text, and the token limit the
// client set is what is left.
func TestContinuationBody(t *testing.T) {
	tests := []struct {
		name string
		ep   engine.Endpoint
		body string
		want map[string]string
	}{
		{"chat", engine.Chat, `{"model":"m","messages":[{"role":"user","content":"q"}],"max_completion_tokens":9,"seed":3}`,
			map[string]string{"messages": `[{"role":"user","content":"q"},{"content":"the \"and\" ","role":"assistant"}]`,
				"max_completion_tokens": "5", "max_tokens": "", "seed": "3"}},
		{"chat without a limit", engine.Chat, `{"model":"m","messages":[{"role":"user","content":"q"}]}`,
			map[string]string{"max_tokens": "5"}},
		{"completions", engine.Completion, `{"model":"m","prompt":["q "],"max_tokens":9}`,
			map[string]string{"prompt": `"q the \"and\" "`, "max_tokens": "5"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := &Request{Endpoint: tt.ep, Req: engine.Request{Body: []byte(tt.body), Prompt: []byte("q ")}}
			b, err := continuationBody(o, `the "and" `, 5)
			if err != nil {
				t.Fatal(err)
			}
			var m map[string]json.RawMessage
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			for k, v := range tt.want {
				if got := string(m[k]); got != v {
					t.Errorf("%s = %s, want %s", k, got, v)
				}
			}
		})
	}
}
