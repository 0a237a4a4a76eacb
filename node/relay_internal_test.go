package node

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/node/engine"
)

// TestClientStream pins how a relayed stream reaches the client: whole events only, however
// the owner's bytes are cut; the text and the chunks that carried it counted; the end seen
// ([DONE] or an error event); and, after resume, a continuation's events in the same response
// without its own role chunk, its headers and status kept from the client.
func TestClientStream(t *testing.T) {
	rec := httptest.NewRecorder()
	cs := newClientStream(rec, engine.Chat, true)
	role := `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}` + "\n\n"
	chunk := func(s string) string {
		return `data: {"choices":[{"index":0,"delta":{"content":"` + s + `"}}]}` + "\n\n"
	}
	cs.Header().Set("X-Kvmesh-Node", "owner")
	cs.WriteHeader(200)
	first := role + chunk("the ") + chunk("") + chunk("and ")
	for _, piece := range []string{first[:10], first[10 : len(first)-5], first[len(first)-5:], chunk("for ")[:20]} {
		if _, err := cs.Write([]byte(piece)); err != nil {
			t.Fatal(err)
		}
	}
	if got := rec.Body.String(); got != first {
		t.Fatalf("client got %q, want the whole events %q", got, first)
	}
	if cs.text.String() != "the and " || cs.tokens != 2 || cs.ended() {
		t.Fatalf("text %q in %d chunks, ended %v", cs.text.String(), cs.tokens, cs.ended())
	}
	// The owner failed mid-event: the continuation takes over.
	cs.resume()
	cs.Header().Set("X-Kvmesh-Node", "next")
	cs.WriteHeader(200)
	rest := chunk("for ") + `data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}` + "\n\n" + "data: [DONE]\n\n"
	if _, err := cs.Write([]byte(role + rest)); err != nil {
		t.Fatal(err)
	}
	if got, want := rec.Body.String(), first+rest; got != want {
		t.Errorf("client got %q, want %q", got, want)
	}
	if rec.Header().Get("X-Kvmesh-Node") != "owner" || rec.Code != 200 {
		t.Errorf("client's headers %v, status %d", rec.Header(), rec.Code)
	}
	if o, ended := cs.outcome(); !ended || !o.completed || cs.text.String() != "the and for " || cs.tokens != 3 {
		t.Errorf("outcome %+v ended %v, text %q in %d chunks", o, ended, cs.text.String(), cs.tokens)
	}

	// A continuation that fails before its first token sends the client nothing.
	rec = httptest.NewRecorder()
	cs = newClientStream(rec, engine.Completion, true)
	_, _ = cs.Write([]byte(`data: {"choices":[{"index":0,"text":"the "}]}` + "\n\n"))
	cs.resume()
	cs.WriteHeader(502)
	_, _ = cs.Write([]byte(`{"error":{"message":"engine failed"}}`))
	if strings.Contains(rec.Body.String(), "engine failed") || cs.ended() || cs.tokens != 1 {
		t.Errorf("client got %q (ended %v, %d chunks)", rec.Body.String(), cs.ended(), cs.tokens)
	}
}

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
			o := &prepared{endpoint: tt.ep, req: engine.Request{Body: []byte(tt.body), Prompt: []byte("q ")}}
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
