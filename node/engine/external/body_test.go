package external

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/node/engine"
	wire "github.com/kvmesh/kvmesh/node/openai"
)

// FuzzForceStreaming: for any JSON object, the engine's body is a JSON object with streaming
// and usage on and every other member as the client sent it.
func FuzzForceStreaming(f *testing.F) {
	f.Add([]byte(`{"model":"m","stream":false,"top_k":4,"guided_json":{"a":[1,2]}}`))
	f.Add([]byte(` { "stream_options" : {"include_usage":false,"x":1} , "stream":null } `))
	f.Add([]byte(`{"stream_options":3,"s\u0074ream":false}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var in map[string]json.RawMessage
		if json.Unmarshal(body, &in) != nil || in == nil {
			return
		}
		out, err := ForceStreaming(&engine.Request{Body: body})
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		var got map[string]json.RawMessage
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%s gave %s: %v", body, out, err)
		}
		var opts struct {
			IncludeUsage *bool `json:"include_usage"`
		}
		if string(got["stream"]) != "true" || json.Unmarshal(got["stream_options"], &opts) != nil ||
			opts.IncludeUsage == nil || !*opts.IncludeUsage {
			t.Fatalf("%s gave %s: streaming or usage not forced", body, out)
		}
		for k, v := range in {
			if k == "stream" || k == "stream_options" {
				continue
			}
			if !bytes.Equal(got[k], v) {
				t.Fatalf("%s gave %s: member %q changed from %s to %s", body, out, k, v, got[k])
			}
		}
		if len(got) != len(in)+2-boolInt(in["stream"] != nil)-boolInt(in["stream_options"] != nil) {
			t.Fatalf("%s gave %s: members added or lost", body, out)
		}
	})
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestSetMaxTokens: the engine's cap is the one admission decided: added when the client sent
// none, lowered where it stands when admission clamped it, and every other byte as sent.
func TestSetMaxTokens(t *testing.T) {
	tests := []struct {
		name string
		body string
		n    int
		want string
	}{
		{"none sent: the default", `{"model":"m","stream":true}`, 1024, `{"model":"m","stream":true,"max_tokens":1024}`},
		{"null is none", `{"max_tokens" : null, "prompt":"p"}`, 16, `{"max_tokens" : 16, "prompt":"p"}`},
		{"clamped where it stands", ` {"max_tokens":9000 ,"top_k":4}`, 100, `{"max_tokens":100 ,"top_k":4}`},
		{"as admitted: kept, as an integer", `{"max_tokens":3.0,"x":1}`, 3, `{"max_tokens":3,"x":1}`},
		{"chat's other name, and max_tokens beside it", `{"max_completion_tokens":5000,"m":"\u00e9"}`, 64,
			`{"max_completion_tokens":64,"m":"\u00e9","max_tokens":64}`},
		{"both names, each capped", `{"max_tokens":5000,"max_completion_tokens":50}`, 50,
			`{"max_tokens":50,"max_completion_tokens":50}`},
		{"llama.cpp's n_predict, -1 unbounded", `{"n_predict":-1,"max_tokens":8}`, 8, `{"n_predict":8,"max_tokens":8}`},
		{"min_tokens over the cap lowered to it", `{"min_tokens":2000,"x":1}`, 1024, `{"min_tokens":1024,"x":1,"max_tokens":1024}`},
		{"min_tokens under the cap kept", `{"min_tokens":20,"max_tokens":50}`, 50, `{"min_tokens":20,"max_tokens":50}`},
		{"every occurrence", `{"max_tokens":1,"max_tokens":"x"}`, 2, `{"max_tokens":1,"max_tokens":2}`},
		{"empty object", `{}`, 7, `{"max_tokens":7}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := setMaxTokens([]byte(tt.body), tt.n, true)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
	for _, bad := range []string{`[1]`, `{"a":1} {}`, `{"a":`, ``} {
		if _, err := setMaxTokens([]byte(bad), 1, true); !errors.Is(err, engine.ErrRejected) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// TestDropPriority: a client's priority is removed wherever it stands, its comma with it, and
// every other byte is as sent.
func TestDropPriority(t *testing.T) {
	for body, want := range map[string]string{
		`{"model":"m","priority":-1000}`:                  `{"model":"m"}`,
		`{ "priority" : -1000 , "top_k":4, "priority":9}`: `{  "top_k":4}`,
		`{"pr\u0069ority":1,"a":{"priority":2}}`:          `{"a":{"priority":2}}`,
		`{"priority":1}`:                                  `{}`,
		` {"a,\"b":1, "c":[1,2]}` + "\n":                  `{"a,\"b":1, "c":[1,2]}`,
	} {
		got, err := dropPriority([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Errorf("%s gave\n%s\nwant\n%s", body, got, want)
		}
	}
	if _, err := dropPriority([]byte(`{"priority":1} x`)); !errors.Is(err, engine.ErrRejected) {
		t.Errorf("trailing data: %v", err)
	}
}

// FuzzDropPriority: for any JSON object, the engine's body is a JSON object without priority
// and with every other member as the client sent it.
func FuzzDropPriority(f *testing.F) {
	f.Add([]byte(`{"priority":3,"model":"m","top_k":4}`))
	f.Add([]byte(` { "stream" : true , "priority":null, "priority":{"a":1} } `))
	f.Add([]byte(`{"pr\u0069ority":1,"a,\"b\u0022":{"priority":2}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var in map[string]json.RawMessage
		if json.Unmarshal(body, &in) != nil || in == nil {
			return
		}
		out, err := dropPriority(body)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		var got map[string]json.RawMessage
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%s gave %s: %v", body, out, err)
		}
		for k, v := range in {
			if k != "priority" && !bytes.Equal(got[k], v) {
				t.Fatalf("%s gave %s: member %q changed from %s to %s", body, out, k, v, got[k])
			}
		}
		if _, ok := got["priority"]; ok || len(got) != len(in)-boolInt(in["priority"] != nil) {
			t.Fatalf("%s gave %s: priority kept, or members added or lost", body, out)
		}
	})
}

// TestGenerateSendsAdmittedMaxTokens: the engine is sent the request's MaxTokens, admission's,
// in place of the client's absent or larger cap.
func TestGenerateSendsAdmittedMaxTokens(t *testing.T) {
	f := newFake(t)
	f.set(vllmCache(100, ""))
	f.setGen(reply(10, -1))
	e := newEngine(t, f, KindVLLM, nil)
	const msgs = `{"model":"a","messages":[{"role":"user","content":"x"}]`
	const image = `{"model":"a","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]`
	for _, tt := range []struct{ body, want string }{
		{msgs + `}`, msgs + `,"stream":true,"stream_options":{"include_usage":true},"max_tokens":1024}`},
		{msgs + `,"max_completion_tokens":100000}`, msgs + `,"max_completion_tokens":1024,"stream":true,"stream_options":{"include_usage":true},"max_tokens":1024}`},
		{image + `}`, image + `,"stream":true,"stream_options":{"include_usage":true}}`}, // its size is the engine's to count
		{image + `,"max_tokens":9000}`, image + `,"max_tokens":1024,"stream":true,"stream_options":{"include_usage":true}}`},
	} {
		req := &engine.Request{ID: "r", Endpoint: engine.Chat, Model: "a", Body: []byte(tt.body), MaxTokens: 1024, PromptTokens: 10}
		if strings.HasPrefix(tt.body, image) {
			req.Extra = []wire.Field{{Name: "messages[0].content", Value: []byte(`{"type":"image_url","image_url":{"url":"x"}}`)}}
		}
		st, err := e.Generate(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		drain(t, st)
		if got := <-f.bodies; string(got) != tt.want {
			t.Errorf("the engine got\n%s\nwant\n%s", got, tt.want)
		}
	}
}

// BenchmarkEngineBody: the body an engine is sent for a chat of a 400 KB prompt (streaming,
// priority and output cap, one pass).
func BenchmarkEngineBody(b *testing.B) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("word ", 80000) + `"}],"max_tokens":9000,"priority":3}`)
	e := &Engine{cfg: Config{Priority: true}}
	req := &engine.Request{Endpoint: engine.Chat, Body: body, MaxTokens: 1024, Priority: 10}
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := e.body(req); err != nil {
			b.Fatal(err)
		}
	}
}
