package external

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/node/engine"
)

// TestPrefillHalfOnVLLM pins the prefill half as vLLM's proxy sends it: the client's body
// with kv_transfer_params asking for a remote decode, stream false, max_tokens and
// max_completion_tokens 1, no stream_options or min_tokens, the same request id; and the
// answer's kv_transfer_params, byte for byte, as the handover's params with the answer's
// prompt and cached tokens.
func TestPrefillHalfOnVLLM(t *testing.T) {
	f := newFake(t)
	const params = `{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2],"remote_engine_id":"p0","remote_host":"10.0.0.1","remote_port":5600,"tp_size":1}`
	ids := make(chan string, 1)
	f.gen = func(w http.ResponseWriter, r *http.Request) {
		ids <- r.Header.Get("X-Request-Id")
		io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"A"},"finish_reason":"length"}],`+
			`"usage":{"prompt_tokens":700,"completion_tokens":1,"total_tokens":701,"prompt_tokens_details":{"cached_tokens":96}},"kv_transfer_params":`+params+`}`)
	}
	e := newEngine(t, f, KindVLLM, nil)
	req := &engine.Request{ID: "r1", PrefillOnly: true, PromptTokens: 650, Blocks: []uint64{7},
		Body: []byte(`{"model":"a","messages":[{"role":"user","content":"x"}],"max_tokens":50,"max_completion_tokens":50,"min_tokens":3,"stream":true,"stream_options":{"include_usage":true},"top_k":4}`)}
	st, sent := generateSent(t, e, f, req)
	want := map[string]string{"stream": "false", "max_tokens": "1", "max_completion_tokens": "1", "top_k": "4",
		"kv_transfer_params": `{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`}
	for k, v := range want {
		if string(sent[k]) != v {
			t.Errorf("sent %s = %s, want %s", k, sent[k], v)
		}
	}
	for _, k := range []string{"stream_options", "min_tokens"} {
		if _, ok := sent[k]; ok {
			t.Errorf("sent %s to the prefill server", k)
		}
	}
	if id := <-ids; id != "r1" {
		t.Errorf("X-Request-Id %q, want r1", id)
	}
	c, err := st.Recv()
	if err != nil || c.FinishReason != engine.FinishHandover || c.Handover == nil || c.Text != "" {
		t.Fatalf("chunk %+v, %v; want a handover", c, err)
	}
	if h := c.Handover; string(h.Params) != params || h.PromptTokens != 700 || h.CachedTokens != 96 || len(h.Blocks) != 1 {
		t.Errorf("handover %+v (params %s)", h, h.Params)
	}
	if _, err := st.Recv(); err != io.EOF {
		t.Errorf("after the handover: %v, want io.EOF", err)
	}

	// The decode half: the client's body, streamed, with the prefill's params.
	f.gen = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\n"+
			"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":700,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n")
	}
	req = &engine.Request{ID: "r1", Body: []byte(`{"model":"a","messages":[]}`), Handover: c.Handover}
	_, sent = generateSent(t, e, f, req)
	if string(sent["kv_transfer_params"]) != params || string(sent["stream"]) != "true" {
		t.Errorf("decode body %v, want the prefill's params and a stream", sent)
	}
}

// TestPrefillAnswerMalformed pins that a prefill server's answer the node cannot use is the
// engine's failure (engine.ErrUnavailable, so another prefill node is tried), with a message
// saying what is wrong, never a panic; and that a server's 4xx stays the client's.
func TestPrefillAnswerMalformed(t *testing.T) {
	tests := []struct {
		name, body, err string
		status          int
	}{
		{"not JSON", `<html>oops</html>`, "not a JSON object", 0},
		{"no connector", `{"choices":[],"kv_transfer_params":null}`, "--kv-transfer-config", 0},
		{"params not an object", `{"kv_transfer_params":[1]}`, "not an object", 0},
		{"params too large", `{"kv_transfer_params":{"x":"` + strings.Repeat("a", engine.MaxHandoverParams) + `"}}`, "over", 0},
		{"refused", `{"error":{"message":"bad","type":"BadRequestError"}}`, "bad", http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			f.gen = func(w http.ResponseWriter, r *http.Request) {
				if tt.status != 0 {
					w.WriteHeader(tt.status)
				}
				io.WriteString(w, tt.body)
			}
			e := newEngine(t, f, KindVLLM, nil)
			_, err := e.Generate(context.Background(), &engine.Request{PrefillOnly: true, Body: []byte(`{"model":"a","messages":[]}`)})
			want := engine.ErrUnavailable
			if tt.status != 0 {
				want = engine.ErrRejected
			}
			if !errors.Is(err, want) || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("error %v, want %v saying %q", err, want, tt.err)
			}
		})
	}
	// Only vLLM's halves are passed.
	e := newEngine(t, newFake(t), KindSGLang, nil)
	if _, err := e.Generate(context.Background(), &engine.Request{PrefillOnly: true}); !errors.Is(err, engine.ErrUnavailable) {
		t.Errorf("a prefill half on SGLang: %v, want ErrUnavailable", err)
	}
}

// generateSent starts req on e and returns its stream and the body f received.
func generateSent(t *testing.T, e *Engine, f *fake, req *engine.Request) (engine.Stream, map[string]json.RawMessage) {
	t.Helper()
	st, err := e.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	var sent map[string]json.RawMessage
	if err := json.Unmarshal(<-f.bodies, &sent); err != nil {
		t.Fatal(err)
	}
	return st, sent
}
