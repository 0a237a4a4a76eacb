package external

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/node/engine"
)

// modelsLoRA is vLLM's /v1/models with LoRA adapters: each lists its parent and root, and no
// max_model_len; x is an adapter of a model the engine does not serve here.
const modelsLoRA = `{"object":"list","data":[
{"id":"base","object":"model","root":"/models/base","parent":null,"max_model_len":8192},
{"id":"other","object":"model","max_model_len":4096},
{"id":"sql","object":"model","root":"/lora/sql","parent":"base"},
{"id":"chat","object":"model","root":"/lora/chat","parent":"base"},
{"id":"x","object":"model","root":"/lora/x","parent":"other"}]}`

// vLLM keeps a lora_requests_info series for every label set it had; the latest is the one
// with the largest value (the time it was set).
const metricsLoRA = `vllm:num_requests_running 2
vllm:num_requests_waiting 1
vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.7000000e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql,chat",waiting_lora_adapters="x"} 1.7000005e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql",waiting_lora_adapters=""} 1.7000003e+09
`

func TestAdaptersDiscoveredFromVLLM(t *testing.T) {
	tests := []struct {
		name       string
		configured []engine.Model
		want       []engine.Model
	}{
		{"every model", nil, []engine.Model{
			{Name: "base", ContextTokens: 8192, Root: "/models/base"},
			{Name: "other", ContextTokens: 4096},
			{Name: "sql", ContextTokens: 8192, Parent: "base", Root: "/lora/sql"},
			{Name: "chat", ContextTokens: 8192, Parent: "base", Root: "/lora/chat"},
			{Name: "x", ContextTokens: 4096, Parent: "other", Root: "/lora/x"},
		}},
		{"configured base: its adapters too", []engine.Model{{Name: "base"}}, []engine.Model{
			{Name: "base", ContextTokens: 8192, Root: "/models/base"},
			{Name: "sql", ContextTokens: 8192, Parent: "base", Root: "/lora/sql"},
			{Name: "chat", ContextTokens: 8192, Parent: "base", Root: "/lora/chat"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			f.mu.Lock()
			f.models = modelsLoRA
			f.mu.Unlock()
			f.set(metricsLoRA)
			e := newEngine(t, f, KindVLLM, func(c *Config) { c.Models = tt.configured })
			if got := e.Models(); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("models\n got %+v\nwant %+v", got, tt.want)
			}
			want := engine.LoRAState{MaxLoRAs: 4, Resident: []string{"chat", "sql"}, Running: []string{"chat", "sql"}, Waiting: []string{"x"}}
			if got := e.State().LoRA; !reflect.DeepEqual(got, want) {
				t.Errorf("LoRA state %+v, want %+v", got, want)
			}
		})
	}
}

func TestNoLoRAInfoIsNoAdapterState(t *testing.T) {
	f := newFake(t)
	f.set("vllm:num_requests_running 2\nvllm:num_requests_waiting 1\n")
	e := newEngine(t, f, KindVLLM, nil)
	if got := e.State().LoRA; !reflect.DeepEqual(got, engine.LoRAState{}) {
		t.Errorf("LoRA state %+v, want none", got)
	}
}

// SGLang's OpenAI API takes an adapter as BASE:ADAPTER: a request for an adapter goes with its
// model so rewritten, a base model's as it is; vLLM is sent the adapter's name.
func TestSGLangAdapterRequestsNameTheirBase(t *testing.T) {
	for _, tt := range []struct{ kind, model, want string }{
		{KindSGLang, "sql", `"base:sql"`},
		{KindSGLang, "base", `"base"`},
		{KindVLLM, "sql", `"sql"`},
	} {
		f := newFake(t)
		f.models = modelsLoRA
		f.gen = func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) }
		e := newEngine(t, f, tt.kind, nil)
		body := `{"model":"` + tt.model + `","messages":[{"role":"user","content":"x"}]}`
		_, sent := generateSent(t, e, f, &engine.Request{Model: tt.model, Body: []byte(body)})
		if got := string(sent["model"]); got != tt.want {
			t.Errorf("%s, %s: sent model %s, want %s", tt.kind, tt.model, got, tt.want)
		}
	}
}

// The runtime adapter API: vLLM's paths and answers, SGLang's, and what counts as done.
func TestAdapterRuntimeCalls(t *testing.T) {
	type call struct{ path, body string }
	calls := make(chan call, 8)
	answers := map[string]struct {
		status int
		body   string
	}{
		"/v1/load_lora_adapter/ok":      {200, "Success: LoRA adapter 'ok' added successfully."},
		"/v1/load_lora_adapter/dup":     {400, `{"error":{"message":"The lora adapter 'dup' has already been loaded."}}`},
		"/v1/load_lora_adapter/bad":     {400, `{"error":{"message":"No adapter found for /x"}}`},
		"/v1/unload_lora_adapter/gone":  {404, `{"error":{"message":"The lora adapter 'gone' cannot be found."}}`},
		"/load_lora_adapter/ok":         {200, `{"success":true,"error_message":"","loaded_adapters":{"ok":"/x"}}`},
		"/load_lora_adapter/bad":        {400, `{"success":false,"error_message":"rank 64 over max_lora_rank 16"}`},
		"/load_lora_adapter/falseIn200": {200, `{"success":false,"error_message":"pool full"}`},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b loraRequest
		data, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(data, &b)
		calls <- call{r.URL.Path, string(data)}
		a := answers[r.URL.Path+"/"+b.Name]
		w.WriteHeader(a.status)
		io.WriteString(w, a.body)
	}))
	t.Cleanup(srv.Close)
	for _, tt := range []struct {
		kind, name string
		unload     bool
		err        string // "" for success
	}{
		{KindVLLM, "ok", false, ""},
		{KindVLLM, "dup", false, ""},
		{KindVLLM, "bad", false, "No adapter found"},
		{KindVLLM, "gone", true, ""},
		{KindSGLang, "ok", false, ""},
		{KindSGLang, "bad", false, "rank 64"},
		{KindSGLang, "falseIn200", false, "pool full"},
	} {
		e := &Engine{cfg: Config{Kind: tt.kind}, client: srv.Client()}
		e.base, _ = url.Parse(srv.URL)
		var err error
		if tt.unload {
			err = e.UnloadAdapter(t.Context(), tt.name)
		} else {
			err = e.LoadAdapter(t.Context(), tt.name, "/x")
		}
		c := <-calls
		if (err == nil) != (tt.err == "") || err != nil && !strings.Contains(err.Error(), tt.err) {
			t.Errorf("%s %s: err %v, want %q", tt.kind, tt.name, err, tt.err)
		}
		if prefix := map[string]string{KindVLLM: "/v1/", KindSGLang: "/"}[tt.kind]; !strings.HasPrefix(c.path, prefix) ||
			strings.HasPrefix(c.path, "/v1/") != (tt.kind == KindVLLM) {
			t.Errorf("%s: path %s", tt.kind, c.path)
		}
		if !tt.unload && !strings.Contains(c.body, `"lora_path":"/x"`) {
			t.Errorf("body %s", c.body)
		}
	}
}
