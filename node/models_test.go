package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/node"
)

// fakeEngine is an OpenAI-compatible engine without metrics (kind "openai"): a /v1/models list
// and an answer to every generation that tests change as they go.
type fakeEngine struct {
	srv *httptest.Server

	mu     sync.Mutex
	models []string // listed, each with max_model_len 4096
	down   bool     // /v1/models answers 503
	status int      // of generations; 0: a short successful stream
	body   string   // of a failed generation
}

func newFakeEngine(t *testing.T, models ...string) *fakeEngine {
	t.Helper()
	f := &fakeEngine{models: models}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.down {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		type entry struct {
			ID          string `json:"id"`
			Object      string `json:"object"`
			MaxModelLen int    `json:"max_model_len"`
		}
		list := struct {
			Object string  `json:"object"`
			Data   []entry `json:"data"`
		}{Object: "list", Data: []entry{}}
		for _, m := range f.models {
			list.Data = append(list.Data, entry{ID: m, Object: "model", MaxModelLen: 4096})
		}
		_ = json.NewEncoder(w).Encode(list)
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		f.mu.Lock()
		status, body := f.status, f.body
		f.mu.Unlock()
		if status != 0 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = io.WriteString(w, body)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range []string{
			`{"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}`,
			`{"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
			`{"id":"x","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`,
			"[DONE]",
		} {
			fmt.Fprintf(w, "data: %s\n\n", e)
		}
	})
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeEngine) setModels(models ...string) {
	f.mu.Lock()
	f.models, f.down = models, false
	f.mu.Unlock()
}

func (f *fakeEngine) setDown() {
	f.mu.Lock()
	f.down = true
	f.mu.Unlock()
}

func (f *fakeEngine) answer(status int, body string) {
	f.mu.Lock()
	f.status, f.body = status, body
	f.mu.Unlock()
}

// external points a node at f, refreshing its model list every 10 ms.
func (f *fakeEngine) external(cfg *node.Config) {
	cfg.Engine, cfg.EngineKind, cfg.ModelsInterval = f.srv.URL, "openai", 10*time.Millisecond
}

// startStandalone starts one node without a mesh (kvmesh engine's shape).
func startStandalone(t *testing.T, configure func(cfg *node.Config)) (*node.Node, string, error) {
	t.Helper()
	cfg := node.DefaultConfig()
	cfg.Name, cfg.HTTPAddr, cfg.Standalone, cfg.GPU = "engine", "127.0.0.1:0", true, "none"
	cfg.Sim.TimeScale, cfg.Sim.KVBlocks = 100, 4096
	configure(&cfg)
	n, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Shutdown(context.Background()) })
	if err := n.Start(context.Background()); err != nil {
		return n, "", err
	}
	return n, "http://" + n.HTTPAddr(), nil
}

func get(t *testing.T, url string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	return resp, readAll(t, resp)
}

// listedModels is a node's GET /v1/models as "id:max_model_len" strings.
func listedModels(t *testing.T, url string) []string {
	t.Helper()
	_, b := get(t, url+"/v1/models")
	var ml struct {
		Data []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &ml); err != nil {
		t.Fatalf("/v1/models %s: %v", b, err)
	}
	var out []string
	for _, m := range ml.Data {
		out = append(out, fmt.Sprintf("%s:%d", m.ID, m.MaxModelLen))
	}
	slices.Sort(out)
	return out
}

// advertised is the models of this node's own gossiped state record.
func advertised(t *testing.T, url string) []string {
	t.Helper()
	var out []string
	for _, m := range selfOf(peers(t, url)).Models {
		out = append(out, fmt.Sprintf("%s:%d", m.Name, m.ContextTokens))
	}
	slices.Sort(out)
	return out
}

func readyz(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, b := get(t, url+"/readyz")
	return resp.StatusCode, string(b)
}

// TestNodeServesWhatItsEngineLists pins model discovery from an external engine with no
// model configured: the node serves, lists and gossips exactly the engine's models with their
// max_model_len, follows a model appearing and one disappearing on the periodic refresh, and
// is unready while the engine lists nothing or does not answer.
func TestNodeServesWhatItsEngineLists(t *testing.T) {
	const llama = "meta-llama/Llama-3.1-8B-Instruct"
	f := newFakeEngine(t, llama, "qwen")
	tn := startNet(t, 1, func(i int, cfg *node.Config) { f.external(cfg) })
	url := tn.URLs()[0]
	want := []string{llama + ":4096", "qwen:4096"}
	if got := listedModels(t, url); !slices.Equal(got, want) {
		t.Errorf("/v1/models = %v, want the engine's %v (not the sim's default)", got, want)
	}
	poll.Until(t, 5*time.Second, "the engine's models in the gossiped record", func() bool {
		return slices.Equal(advertised(t, url), want)
	})
	if status, body := readyz(t, url); status != http.StatusOK {
		t.Errorf("/readyz = %d %s", status, body)
	}

	f.setModels(llama, "mistral")
	want = []string{llama + ":4096", "mistral:4096"}
	poll.Until(t, 5*time.Second, "qwen to go and mistral to come, in /v1/models and gossip", func() bool {
		return slices.Equal(listedModels(t, url), want) && slices.Equal(advertised(t, url), want)
	})
	resp := post(t, url, "/v1/chat/completions", strings.Replace(chatBody("hello", 4, false), model, "qwen", 1), nil)
	if b := readAll(t, resp); resp.StatusCode != http.StatusNotFound || decodeError(t, b).Error.Code != "model_not_found" {
		t.Errorf("a model the engine dropped: %d %s", resp.StatusCode, b)
	}
	resp = post(t, url, "/v1/chat/completions", strings.Replace(chatBody("hello", 4, false), model, "mistral", 1), nil)
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Errorf("a model the engine added: %d %s", resp.StatusCode, b)
	}

	f.setModels()
	poll.Until(t, 5*time.Second, "unready with no model", func() bool {
		status, body := readyz(t, url)
		return status == http.StatusServiceUnavailable && strings.Contains(body, "lists no models")
	})
	f.setDown()
	poll.Until(t, 5*time.Second, "unready with the engine down", func() bool {
		status, body := readyz(t, url)
		return status == http.StatusServiceUnavailable && strings.Contains(body, "unreachable")
	})
	if selfOf(peers(t, url)).EngineHealthy {
		t.Error("the gossiped record says healthy while the engine is down")
	}
	f.setModels("mistral")
	poll.Until(t, 5*time.Second, "ready again", func() bool {
		status, _ := readyz(t, url)
		return status == http.StatusOK && selfOf(peers(t, url)).EngineHealthy
	})
	assertReconciled(t, url, 2)
}

// TestConfiguredModelsAgainstTheEngine pins the rule with --model: a configured model the
// engine does not list stops the node at start, naming it; one it lists is served alone (not
// the engine's others); and the node turns unready when the engine stops listing it.
func TestConfiguredModelsAgainstTheEngine(t *testing.T) {
	f := newFakeEngine(t, "a", "b")
	_, _, err := startStandalone(t, func(cfg *node.Config) { f.external(cfg); cfg.Models = []string{"a", "org/missing"} })
	if err == nil || !strings.Contains(err.Error(), `"org/missing"`) {
		t.Fatalf("Start = %v, want an error naming the missing model", err)
	}

	_, url, err := startStandalone(t, func(cfg *node.Config) { f.external(cfg); cfg.Models = []string{"a"} })
	if err != nil {
		t.Fatal(err)
	}
	if got := listedModels(t, url); !slices.Equal(got, []string{"a:4096"}) {
		t.Errorf("/v1/models = %v, want only the configured a", got)
	}
	f.setModels("b")
	poll.Until(t, 5*time.Second, "unready once the engine drops the only configured model", func() bool {
		status, body := readyz(t, url)
		return status == http.StatusServiceUnavailable && strings.Contains(body, "none of the configured models")
	})
	if got := listedModels(t, url); len(got) != 0 {
		t.Errorf("/v1/models = %v, want none", got)
	}
	f.setModels("a", "b")
	poll.Until(t, 5*time.Second, "ready once it lists it again", func() bool {
		status, _ := readyz(t, url)
		return status == http.StatusOK
	})
}

// TestEngineThatIsDownAtStartStartsUnready pins the start-up decision: an engine that does
// not answer yet (still loading its weights) does not stop the node; the node is unready
// until the engine answers, then serves what it lists.
func TestEngineThatIsDownAtStartStartsUnready(t *testing.T) {
	f := newFakeEngine(t, "a")
	f.setDown()
	_, url, err := startStandalone(t, f.external)
	if err != nil {
		t.Fatalf("Start with the engine down: %v", err)
	}
	if status, body := readyz(t, url); status != http.StatusServiceUnavailable || !strings.Contains(body, "unreachable") {
		t.Errorf("/readyz = %d %s, want 503 naming the unreachable engine", status, body)
	}
	f.setModels("a")
	poll.Until(t, 5*time.Second, "ready once the engine answers", func() bool {
		status, _ := readyz(t, url)
		return status == http.StatusOK
	})
	if got := listedModels(t, url); !slices.Equal(got, []string{"a:4096"}) {
		t.Errorf("/v1/models = %v", got)
	}
}

// TestEngineErrorsKeepTheirStatusAndCode pins that an external engine's 4xx before the first
// token reaches the client with its status, message, param and code (a code by status when
// the engine sends none), on the engine's own node and through a forward, and that a 5xx is a
// 502 engine_error; each is counted once.
func TestEngineErrorsKeepTheirStatusAndCode(t *testing.T) {
	f := newFakeEngine(t, "ext")
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		if i == 0 {
			f.external(cfg)
			return
		}
		cfg.Models = []string{"another-model"} // an ingress only: forwards to n1
	})
	body := func(stream bool) string { return strings.Replace(chatBody("hello", 4, stream), model, "ext", 1) }
	tests := []struct {
		name            string
		status          int
		engineBody      string
		want            int
		code, msg, prm  string
		viaPeer, stream bool
	}{
		{name: "openai-shaped 400", status: 400, engineBody: `{"error":{"message":"temperature too hot","type":"invalid_request_error","param":"temperature","code":"invalid_temperature"}}`,
			want: 400, code: "invalid_temperature", msg: "temperature too hot", prm: "temperature"},
		{name: "openai-shaped 400, streaming, through a peer", status: 400, engineBody: `{"error":{"message":"temperature too hot","type":"invalid_request_error","param":"temperature","code":"invalid_temperature"}}`,
			want: 400, code: "invalid_temperature", msg: "temperature too hot", prm: "temperature", viaPeer: true, stream: true},
		{name: "vllm 404, numeric code", status: 404, engineBody: `{"error":{"message":"The model does not exist.","type":"NotFoundError","param":null,"code":404}}`,
			want: 404, code: "model_not_found", msg: "The model does not exist."},
		{name: "vllm 404 through a peer", status: 404, engineBody: `{"error":{"message":"The model does not exist.","type":"NotFoundError","param":null,"code":404}}`,
			want: 404, code: "model_not_found", msg: "The model does not exist.", viaPeer: true},
		{name: "413", status: 413, engineBody: `{"error":{"message":"prompt too large","code":null}}`, want: 413, code: "body_too_large", msg: "prompt too large"},
		{name: "tgi 422", status: 422, engineBody: `{"error":"Input validation error","error_type":"validation"}`, want: 422, code: "invalid_request", msg: "Input validation error"},
		{name: "500", status: 500, engineBody: `{"error":{"message":"CUDA out of memory","code":"oom"}}`, want: 502, code: "engine_error"},
		{name: "503", status: 503, engineBody: `busy`, want: 502, code: "engine_error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f.answer(tt.status, tt.engineBody)
			url := tn.URLs()[0]
			if tt.viaPeer {
				url = tn.URLs()[1]
			}
			resp := post(t, url, "/v1/chat/completions", body(tt.stream), nil)
			b := readAll(t, resp)
			if resp.StatusCode != tt.want {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.want, b)
			}
			e := decodeError(t, b).Error
			if e.Code != tt.code || (tt.msg != "" && e.Message != tt.msg) || resp.Header.Get(node.HeaderReason) != tt.code {
				t.Errorf("error %+v (%s %q), want code %s message %q", e, node.HeaderReason, resp.Header.Get(node.HeaderReason), tt.code, tt.msg)
			}
			if tt.prm != "" && (e.Param == nil || *e.Param != tt.prm) {
				t.Errorf("param %v, want %s", e.Param, tt.prm)
			}
			if tt.viaPeer && resp.Header.Get(node.HeaderRequestID) == "" {
				t.Errorf("no %s on a relayed refusal", node.HeaderRequestID)
			}
		})
	}
	f.answer(0, "")
	if resp := post(t, tn.URLs()[0], "/v1/chat/completions", body(false), nil); resp.StatusCode != 200 {
		t.Fatalf("a good request: %d %s", resp.StatusCode, readAll(t, resp))
	} else {
		readAll(t, resp)
	}
	assertReconciled(t, tn.URLs()[0], 7)
	assertReconciled(t, tn.URLs()[1], 2)
	for url, codes := range map[string]map[string]float64{
		// The client gets the engine's own code; the counters label it engine_rejected, so that
		// an engine's codes cannot grow their label set.
		tn.URLs()[0]: {"engine_rejected": 1, "invalid_temperature": 0, "model_not_found": 1, "body_too_large": 1, "invalid_request": 1},
		tn.URLs()[1]: {"engine_rejected": 1, "model_not_found": 1},
	} {
		for code, n := range codes {
			if got := metric(t, url, "kvmesh_requests_refused_total", `code="`+code+`"`); got != n {
				t.Errorf("%s: refused{code=%q} = %v, want %v", url, code, got, n)
			}
		}
	}
	if got := metric(t, tn.URLs()[0], "kvmesh_requests_failed_total", `code="engine_error"`); got != 2 {
		t.Errorf("failed{engine_error} = %v, want 2", got)
	}
}

// assertReconciled checks the accounting identity: every generation request received was
// completed, refused or failed, once; received is want.
func assertReconciled(t *testing.T, url string, want float64) {
	t.Helper()
	received := metric(t, url, "kvmesh_requests_received_total", "")
	done := metric(t, url, "kvmesh_requests_completed_total", "") + metric(t, url, "kvmesh_requests_refused_total", "") +
		metric(t, url, "kvmesh_requests_failed_total", "")
	if received != want || done != received {
		t.Errorf("%s: received %v (want %v), completed+refused+failed %v", url, received, want, done)
	}
}

// TestModelRetrieve pins GET /v1/models/{id}: OpenAI's model object for a model served in
// the mesh, whatever slashes its id holds and however they are sent, and 404 model_not_found
// in OpenAI's error shape for another.
func TestModelRetrieve(t *testing.T) {
	const llama = "meta-llama/Llama-3.1-8B-Instruct"
	tn := startNet(t, 1, func(i int, cfg *node.Config) { cfg.Models = []string{llama, model} })
	url := tn.URLs()[0]
	for path, id := range map[string]string{
		"/v1/models/" + llama:                           llama,
		"/v1/models/meta-llama%2FLlama-3.1-8B-Instruct": llama,
		"/v1/models/" + model:                           model,
	} {
		t.Run(path, func(t *testing.T) {
			resp, b := get(t, url+path)
			var m struct {
				ID          string `json:"id"`
				Object      string `json:"object"`
				OwnedBy     string `json:"owned_by"`
				MaxModelLen int    `json:"max_model_len"`
			}
			if resp.StatusCode != 200 || json.Unmarshal(b, &m) != nil || m.ID != id || m.Object != "model" || m.OwnedBy == "" || m.MaxModelLen <= 0 {
				t.Errorf("%d %s, want the model object of %s", resp.StatusCode, b, id)
			}
		})
	}
	for _, path := range []string{"/v1/models/nope", "/v1/models/meta-llama/nope", "/v1/models/"} {
		t.Run(path, func(t *testing.T) {
			resp, b := get(t, url+path)
			if e := decodeError(t, b); resp.StatusCode != 404 || e.Error.Code != "model_not_found" || e.Error.Type != "invalid_request_error" ||
				e.Error.Param == nil || *e.Error.Param != "model" {
				t.Errorf("%d %s", resp.StatusCode, b)
			}
		})
	}
}

// TestWrongMethodIs405 pins that every known path answers a method it does not take with 405,
// an Allow header and an OpenAI error body, counts no request, and that an unknown path is
// still a 404 in that shape.
func TestWrongMethodIs405(t *testing.T) {
	tn := startNet(t, 1, nil)
	url := tn.URLs()[0]
	tests := []struct {
		method, path, allow string
	}{
		{http.MethodGet, "/v1/chat/completions", "POST"},
		{http.MethodPut, "/v1/completions", "POST"},
		{http.MethodPost, "/v1/models", "GET, HEAD"},
		{http.MethodDelete, "/v1/models/" + model, "GET, HEAD"},
		{http.MethodPost, "/healthz", "GET, HEAD"},
		{http.MethodPost, "/readyz", "GET, HEAD"},
		{http.MethodPost, "/metrics", "GET, HEAD"},
		{http.MethodPatch, "/v1/mesh/peers", "GET, HEAD"},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, url+tt.path, strings.NewReader(`{}`))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b := readAll(t, resp)
			if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != tt.allow {
				t.Fatalf("status %d Allow %q, want 405 %q: %s", resp.StatusCode, resp.Header.Get("Allow"), tt.allow, b)
			}
			if e := decodeError(t, b); e.Error.Code != "method_not_allowed" || e.Error.Type != "invalid_request_error" || e.Error.Message == "" ||
				resp.Header.Get("Content-Type") != "application/json" {
				t.Errorf("body %s (Content-Type %q)", b, resp.Header.Get("Content-Type"))
			}
		})
	}
	req, _ := http.NewRequest(http.MethodHead, url+"/v1/models", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Errorf("HEAD /v1/models: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	resp, b := get(t, url+"/v1/nothing/here")
	if e := decodeError(t, b); resp.StatusCode != 404 || e.Error.Code != "not_found" {
		t.Errorf("unknown path: %d %s", resp.StatusCode, b)
	}
	assertReconciled(t, url, 0)
}

// TestNodeInFrontOfKvmeshEngineLearnsItsModels pins discovery against kvmesh's own engine
// (a standalone node, as `kvmesh engine` runs): a node given no model serves the engine's,
// slashes and all, with its context, and not the embedded engine's default.
func TestNodeInFrontOfKvmeshEngineLearnsItsModels(t *testing.T) {
	const llama = "meta-llama/Llama-3.1-8B-Instruct"
	_, engineURL, err := startStandalone(t, func(cfg *node.Config) { cfg.Models = []string{llama} })
	if err != nil {
		t.Fatal(err)
	}
	tn := startNet(t, 1, func(i int, cfg *node.Config) { cfg.Engine, cfg.EngineKind = engineURL, "vllm" })
	url := tn.URLs()[0]
	if got, want := listedModels(t, url), []string{llama + ":131072"}; !slices.Equal(got, want) {
		t.Errorf("/v1/models = %v, want the engine's %v", got, want)
	}
	if resp, b := get(t, url+"/v1/models/"+llama); resp.StatusCode != 200 {
		t.Errorf("GET /v1/models/%s: %d %s", llama, resp.StatusCode, b)
	}
	resp := post(t, url, "/v1/chat/completions", strings.Replace(chatBody("hello", 4, true), model, llama, 1), nil)
	if ev := sseEvents(t, readAll(t, resp)); resp.StatusCode != 200 || ev[len(ev)-1] != "[DONE]" {
		t.Errorf("chat: %d %q", resp.StatusCode, ev)
	}
	resp = post(t, url, "/v1/chat/completions", chatBody("hello", 4, false), nil)
	if b := readAll(t, resp); resp.StatusCode != http.StatusNotFound || decodeError(t, b).Error.Code != "model_not_found" {
		t.Errorf("the default model, which the engine does not serve: %d %s", resp.StatusCode, b)
	}
	assertReconciled(t, url, 2)
}
