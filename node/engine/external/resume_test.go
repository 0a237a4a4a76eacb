package external

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/kvmesh/kvmesh/node/engine"
)

// TestResumedRequestContinuesTheFinalMessage pins what a continuation sends each kind of
// server and what it reports: for chat, the flag that continues the final assistant message
// (vLLM's with add_generation_prompt off; none for llama.cpp, which continues it by default,
// and a plain OpenAI server), for completions none; min_tokens less the tokens sent before;
// and the whole generation's usage.
func TestResumedRequestContinuesTheFinalMessage(t *testing.T) {
	const chat = `{"model":"a","messages":[{"role":"user","content":"q"},{"role":"assistant","content":"the and "}],"max_tokens":6,"min_tokens":5}`
	const completion = `{"model":"a","prompt":"q the and ","max_tokens":6}`
	tests := []struct {
		kind, body string
		ep         engine.Endpoint
		want       map[string]string // members and their values; "" must be absent
	}{
		{KindVLLM, chat, engine.Chat, map[string]string{"continue_final_message": "true", "add_generation_prompt": "false", "min_tokens": "3"}},
		{KindSGLang, chat, engine.Chat, map[string]string{"continue_final_message": "true", "add_generation_prompt": "", "min_tokens": "3"}},
		{KindTGI, chat, engine.Chat, map[string]string{"continue_final_message": "true", "add_generation_prompt": ""}},
		{KindLlamaCpp, chat, engine.Chat, map[string]string{"continue_final_message": "", "add_generation_prompt": "", "min_tokens": "3"}},
		{KindOpenAI, chat, engine.Chat, map[string]string{"continue_final_message": ""}},
		{KindVLLM, completion, engine.Completion, map[string]string{"continue_final_message": "", "min_tokens": ""}},
	}
	for _, tt := range tests {
		t.Run(tt.kind+"/"+map[engine.Endpoint]string{engine.Chat: "chat", engine.Completion: "completions"}[tt.ep], func(t *testing.T) {
			f := newFake(t)
			f.gen = func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, `data: {"choices":[{"index":0,"delta":{"content":"for "},"text":"for "}]}`+"\n\n")
				io.WriteString(w, `data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`+"\n\n")
				io.WriteString(w, `data: {"choices":[],"usage":{"prompt_tokens":14,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":13}}}`+"\n\n")
				io.WriteString(w, "data: [DONE]\n\n")
			}
			e := newEngine(t, f, tt.kind, nil)
			st, err := e.Generate(context.Background(), &engine.Request{Endpoint: tt.ep, Model: "a", Body: []byte(tt.body), MaxTokens: 6,
				Resume: &engine.Resume{Tokens: 2, Bytes: 8, PromptTokens: 3}})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			var sent map[string]json.RawMessage
			if err := json.Unmarshal(<-f.bodies, &sent); err != nil {
				t.Fatal(err)
			}
			for k, v := range tt.want {
				if got := string(sent[k]); got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
			var last engine.Chunk
			for {
				c, err := st.Recv()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				last = c
			}
			if want := (engine.Usage{PromptTokens: 12, CompletionTokens: 6, CachedTokens: 12}); last.Usage == nil || *last.Usage != want {
				t.Errorf("usage %+v, want %+v", last.Usage, want)
			}
		})
	}
}
