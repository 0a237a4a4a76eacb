package external

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/node/engine"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fake is an httptest engine whose /metrics text and generation handler tests change.
type fake struct {
	srv     *httptest.Server
	mu      sync.Mutex
	metrics string
	status  int // of /metrics; 0 = 200
	// models is the /v1/models body and modelsStatus its status (0 = 200).
	models       string
	modelsStatus int
	modelFetches atomic.Int64
	gen          http.HandlerFunc
	bodies       chan []byte
	priorities   chan string // X-Kvmesh-Priority of each generation request
	scrapes      atomic.Int64
}

func newFake(t *testing.T) *fake {
	t.Helper()
	f := &fake{bodies: make(chan []byte, 16), priorities: make(chan string, 16), models: modelsAB}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		f.scrapes.Add(1)
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.status != 0 {
			w.WriteHeader(f.status)
			return
		}
		io.WriteString(w, f.metrics)
	})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		f.modelFetches.Add(1)
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.modelsStatus != 0 {
			w.WriteHeader(f.modelsStatus)
			return
		}
		io.WriteString(w, f.models)
	})
	h := func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		select {
		case f.bodies <- b:
		default:
		}
		select {
		case f.priorities <- r.Header.Get(PriorityHeader):
		default:
		}
		f.mu.Lock()
		g := f.gen
		f.mu.Unlock()
		g(w, r)
	}
	mux.HandleFunc("POST /v1/chat/completions", h)
	mux.HandleFunc("POST /v1/completions", h)
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

// modelsAB is vLLM-like: a sends max_model_len, b does not.
const modelsAB = `{"object":"list","data":[{"id":"a","object":"model","created":1,"owned_by":"x","max_model_len":4096},{"id":"b","object":"model"}]}`

// setModels sets the /v1/models answer: a status other than 200, or the listed ids (each with
// max_model_len 1000 × its position + 1000).
func (f *fake) setModels(status int, ids ...string) {
	type entry struct {
		ID          string `json:"id"`
		Object      string `json:"object"`
		MaxModelLen int    `json:"max_model_len"`
	}
	list := struct {
		Object string  `json:"object"`
		Data   []entry `json:"data"`
	}{Object: "list", Data: []entry{}}
	for i, id := range ids {
		list.Data = append(list.Data, entry{ID: id, Object: "model", MaxModelLen: 1000 * (i + 1)})
	}
	b, _ := json.Marshal(list)
	f.mu.Lock()
	f.models, f.modelsStatus = string(b), status
	f.mu.Unlock()
}

func (f *fake) set(metrics string) {
	f.mu.Lock()
	f.metrics = metrics
	f.mu.Unlock()
}

func newEngine(t *testing.T, f *fake, kind string, mod func(*Config)) *Engine {
	t.Helper()
	cfg := DefaultConfig()
	cfg.BaseURL = f.srv.URL
	cfg.Kind = kind
	cfg.ScrapeInterval = time.Hour // tests scrape by hand unless they shorten it
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	cfg.HTTPClient = &http.Client{Transport: tr}
	if mod != nil {
		mod(&cfg)
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { e.Close() })
	if err := e.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	return e
}

func TestStateByKind(t *testing.T) {
	tests := []struct {
		kind     string
		first    string
		second   string // scraped next; "" = first again
		want     engine.State
		nominal  bool
		wantHits float64
	}{
		{kind: KindVLLM,
			first: `# HELP vllm:num_requests_waiting x
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 3.0
vllm:num_requests_running{model_name="m"} 7
vllm:kv_cache_usage_perc{model_name="m"} 0.5
vllm:cache_config_info{block_size="32",num_gpu_blocks="1000",enable_prefix_caching="True"} 1.0
vllm:prefix_cache_queries_total{model_name="m"} 1000
vllm:prefix_cache_hits_total{model_name="m"} 100
`,
			second: `vllm:num_requests_waiting{model_name="m"} 3
vllm:num_requests_running{model_name="m"} 7
vllm:kv_cache_usage_perc{model_name="m"} 0.5
vllm:cache_config_info{block_size="32",num_gpu_blocks="1000"} 1
vllm:prefix_cache_queries_total{model_name="m"} 2000
vllm:prefix_cache_hits_total{model_name="m"} 850
`,
			// 32×1000 tokens = 2000 blocks of 16; hit rate (850-100)/(2000-1000).
			want: engine.State{Waiting: 3, Running: 7, KVBlocksTotal: 2000, KVBlocksUsed: 1000}, wantHits: 0.75},
		{kind: KindVLLM, first: "vllm:num_requests_waiting 1\nvllm:gpu_cache_usage_perc 0.25\n",
			want: engine.State{Waiting: 1, KVBlocksTotal: 4096, KVBlocksUsed: 1024}},
		// vLLM 0.8: the hit rate from its gpu_ counters.
		{kind: KindVLLM, first: "vllm:num_requests_waiting 1\nvllm:gpu_prefix_cache_queries_total 100\nvllm:gpu_prefix_cache_hits_total 10\n",
			second: "vllm:num_requests_waiting 1\nvllm:gpu_prefix_cache_queries_total 300\nvllm:gpu_prefix_cache_hits_total 110\n",
			want:   engine.State{Waiting: 1, KVBlocksTotal: 4096}, wantHits: 0.5},
		// A hybrid model on two data-parallel engines: kv_cache_size_tokens, not block_size ×
		// num_gpu_blocks (vllm-project/vllm issue #51163), summed over the engines.
		{kind: KindVLLM, first: `vllm:num_requests_waiting 0
vllm:cache_config_info{block_size="4",engine="0",kv_cache_size_tokens="160000",num_gpu_blocks="100000"} 1
vllm:cache_config_info{block_size="4",engine="1",kv_cache_size_tokens="160000",num_gpu_blocks="100000"} 1
`, want: engine.State{KVBlocksTotal: 20000}},
		{kind: KindSGLang, first: `sglang:num_queue_reqs{tp_rank="0"} 2
sglang:num_running_reqs{tp_rank="0"} 5
sglang:token_usage 0.1
sglang:cache_hit_rate 0.4
sglang:cache_config_info{page_size="1",num_pages="16000"} 1
`, want: engine.State{Waiting: 2, Running: 5, KVBlocksTotal: 1000, KVBlocksUsed: 100}, wantHits: 0.4},
		{kind: KindSGLang, first: "sglang:num_queue_reqs 0\nsglang:max_total_num_tokens 161721\nsglang:token_usage 0.5\n",
			want: engine.State{KVBlocksTotal: 10107, KVBlocksUsed: 5054}},
		{kind: KindLlamaCpp, first: "llamacpp:requests_deferred 4\nllamacpp:requests_processing 1\nllamacpp:kv_cache_usage_ratio 0.5\n",
			want: engine.State{Waiting: 4, Running: 1, KVBlocksTotal: 4096, KVBlocksUsed: 2048}},
		{kind: KindTGI, first: "tgi_queue_size 6\ntgi_batch_current_size 2\n",
			want: engine.State{Waiting: 6, Running: 2, KVBlocksTotal: 4096}},
	}
	for _, tt := range tests {
		t.Run(tt.kind, func(t *testing.T) {
			f := newFake(t)
			f.set(tt.first)
			e := newEngine(t, f, tt.kind, nil)
			if tt.second != "" {
				f.set(tt.second)
				e.scrape(context.Background())
			}
			got := e.State()
			want := tt.want
			want.Healthy, want.BlockTokens, want.MaxRunning, want.HitRate = true, 16, 256, tt.wantHits
			if !reflect.DeepEqual(got, want) {
				t.Errorf("state\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestStateOpenAIKindCountsInflight(t *testing.T) {
	f := newFake(t)
	release := make(chan struct{})
	f.gen = func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}
	e := newEngine(t, f, KindOpenAI, nil)
	if s := e.State(); !s.Healthy || s.Running != 0 || f.scrapes.Load() != 0 {
		t.Fatalf("state %+v, scrapes %d", s, f.scrapes.Load())
	}
	st, err := e.Generate(context.Background(), &engine.Request{Body: []byte(`{"model":"a","messages":[]}`)})
	if err != nil {
		t.Fatal(err)
	}
	if got := e.State().Running; got != 1 {
		t.Errorf("running = %d, want 1", got)
	}
	st.Close()
	st.Close()
	close(release)
	if got := e.State().Running; got != 0 {
		t.Errorf("running after close = %d, want 0", got)
	}
}

// TestUnhealthyAfterFailedScrapes: MaxScrapeFailures failed scrapes in a row make the engine
// unhealthy and its load unknown, reported as none (not the last scrape's); a good scrape
// brings both back.
func TestUnhealthyAfterFailedScrapes(t *testing.T) {
	f := newFake(t)
	f.set(vllmCache(100, "vllm:num_requests_running 3\nvllm:num_requests_waiting 2\nvllm:kv_cache_usage_perc 0.5\n"))
	reg := prometheus.NewRegistry()
	e := newEngine(t, f, KindVLLM, func(c *Config) { c.MaxScrapeFailures = 2; c.Registerer = reg })
	if s := e.State(); !s.Healthy || s.Running != 3 || s.Waiting != 2 || s.KVBlocksUsed != 50 {
		t.Fatalf("after a good scrape %+v", s)
	}
	f.mu.Lock()
	f.status = 500
	f.mu.Unlock()
	e.scrape(context.Background())
	if !e.State().Healthy {
		t.Error("unhealthy after one failure, want MaxScrapeFailures = 2")
	}
	f.set("") // 200 but none of the kind's metrics: also a failure
	f.mu.Lock()
	f.status = 0
	f.mu.Unlock()
	e.scrape(context.Background())
	if s := e.State(); s.Healthy || s.Running != 0 || s.Waiting != 0 || s.KVBlocksUsed != 0 {
		t.Errorf("after two failures %+v, want unhealthy and no load", s)
	}
	if got := counter(t, reg, "kvmesh_engine_scrape_errors_total"); got != 2 {
		t.Errorf("scrape errors = %v, want 2", got)
	}
	f.set("vllm:num_requests_running 1\n")
	e.scrape(context.Background())
	if s := e.State(); !s.Healthy || s.Running != 1 {
		t.Errorf("after recovery %+v", s)
	}
}

func counter(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

func TestScrapeLoopRuns(t *testing.T) {
	f := newFake(t)
	f.set("vllm:num_requests_waiting 1\n")
	e := newEngine(t, f, KindVLLM, func(c *Config) { c.ScrapeInterval = 5 * time.Millisecond })
	f.set("vllm:num_requests_waiting 9\n")
	if !poll.Within(5*time.Second, func() bool { return e.State().Waiting == 9 }) {
		t.Fatalf("scrape loop never picked up the change: %+v", e.State())
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	n := f.scrapes.Load()
	e.Close()
	if f.scrapes.Load() != n {
		t.Error("scrapes continued after Close")
	}
}

func TestModelsFetchedAtStart(t *testing.T) {
	f := newFake(t)
	f.set("vllm:num_requests_waiting 0\n")
	e := newEngine(t, f, KindVLLM, func(c *Config) { c.DefaultContextTokens = 1000 })
	want := []engine.Model{{Name: "a", ContextTokens: 4096}, {Name: "b", ContextTokens: 1000}}
	if got := e.Models(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("models = %v, want %v", got, want)
	}
	if err := e.Health(); err != nil || !e.State().Healthy {
		t.Errorf("health %v, state %+v", err, e.State())
	}
}

// TestConfiguredModelsAreCheckedAndKeepTheirOrder pins the rule for configured models: those
// the engine lists are served, in the configured order, each with the engine's max_model_len,
// else its configured context, else DefaultContextTokens; one the engine does not list fails
// Start, naming it.
func TestConfiguredModelsAreCheckedAndKeepTheirOrder(t *testing.T) {
	f := newFake(t)
	e := newEngine(t, f, KindOpenAI, func(c *Config) {
		c.DefaultContextTokens = 1000
		c.Models = []engine.Model{{Name: "b", ContextTokens: 777}, {Name: "a", ContextTokens: 5}}
	})
	want := []engine.Model{{Name: "b", ContextTokens: 777}, {Name: "a", ContextTokens: 4096}}
	if got := e.Models(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("models = %v, want %v", got, want)
	}
	e = newEngine(t, f, KindOpenAI, func(c *Config) { c.Models = []engine.Model{{Name: "b"}} })
	if got := e.Models(); len(got) != 1 || got[0].Name != "b" || got[0].ContextTokens != 8192 {
		t.Errorf("models = %v, want b with the default context", got)
	}

	cfg := DefaultConfig()
	cfg.BaseURL, cfg.Kind = f.srv.URL, KindOpenAI
	cfg.Models = []engine.Model{{Name: "a"}, {Name: "meta-llama/Llama-3.1-8B-Instruct"}}
	missing, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer missing.Close()
	err = missing.Start(context.Background())
	if !errors.Is(err, ErrModelNotServed) || !strings.Contains(err.Error(), `"meta-llama/Llama-3.1-8B-Instruct"`) ||
		strings.Contains(err.Error(), `serve "a"`) {
		t.Errorf("Start = %v, want ErrModelNotServed naming the missing model only", err)
	}
}

// modelStep is what the engine lists, and what the Engine should then serve (names, space
// separated) and whether it should be healthy.
type modelStep struct {
	listed  []string
	want    string
	healthy bool
}

// TestModelsFollowTheEngine pins the refresh: a model the engine adds is served, one it drops
// is not, and the engine is unhealthy while it serves none of the configured models.
func TestModelsFollowTheEngine(t *testing.T) {
	tests := []struct {
		name       string
		configured []engine.Model
		steps      []modelStep
	}{
		{name: "all the engine lists", steps: []modelStep{{[]string{"a", "b"}, "a b", true}, {[]string{"b", "c"}, "b c", true}, {nil, "", false}, {[]string{"c"}, "c", true}}},
		{name: "configured", configured: []engine.Model{{Name: "a"}, {Name: "b"}}, steps: []modelStep{{[]string{"a", "b"}, "a b", true}, {[]string{"b", "c"}, "b", true}, {[]string{"c"}, "", false}, {[]string{"a", "c"}, "a", true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			f.setModels(0, tt.steps[0].listed...)
			e := newEngine(t, f, KindOpenAI, func(c *Config) { c.Models = tt.configured })
			for i, st := range tt.steps {
				f.setModels(0, st.listed...)
				if err := e.refreshModels(context.Background(), false); err != nil {
					t.Fatal(err)
				}
				var names []string
				for _, m := range e.Models() {
					names = append(names, m.Name)
				}
				if got := strings.Join(names, " "); got != st.want || e.State().Healthy != st.healthy || (e.Health() == nil) != st.healthy {
					t.Errorf("step %d (engine lists %v): serves %q healthy %v (%v), want %q healthy %v",
						i, st.listed, got, e.State().Healthy, e.Health(), st.want, st.healthy)
				}
			}
		})
	}
}

func TestModelsRefreshLoopRuns(t *testing.T) {
	f := newFake(t)
	e := newEngine(t, f, KindOpenAI, func(c *Config) { c.ModelsInterval = 5 * time.Millisecond })
	f.setModels(0, "z")
	if !poll.Within(5*time.Second, func() bool { m := e.Models(); return len(m) == 1 && m[0].Name == "z" }) {
		t.Fatalf("the refresh never picked up the change: %v", e.Models())
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	n := f.modelFetches.Load()
	e.Close()
	if f.modelFetches.Load() != n {
		t.Error("model fetches continued after Close")
	}
}

// TestUnreachableEngineStartsUnready pins the start-up rule: an engine that does not answer
// (here: answers 503 to /v1/models) does not fail Start; it is unhealthy, keeps the configured
// models, is retried every ScrapeInterval, and turns healthy once it answers.
func TestUnreachableEngineStartsUnready(t *testing.T) {
	f := newFake(t)
	f.setModels(http.StatusServiceUnavailable)
	e := newEngine(t, f, KindOpenAI, func(c *Config) {
		c.Models = []engine.Model{{Name: "a", ContextTokens: 100}}
		c.ModelsInterval, c.ScrapeInterval = time.Hour, 5*time.Millisecond
	})
	if e.State().Healthy || e.Health() == nil || !strings.Contains(e.Health().Error(), "unreachable") {
		t.Errorf("healthy with the model list failing: %v", e.Health())
	}
	if got := e.Models(); len(got) != 1 || got[0] != (engine.Model{Name: "a", ContextTokens: 100}) {
		t.Errorf("models before any fetch = %v, want the configured ones", got)
	}
	f.setModels(0, "a")
	if !poll.Within(5*time.Second, func() bool { return e.State().Healthy }) {
		t.Fatalf("never healthy after the engine answered: %v", e.Health())
	}
	if got := e.Models(); len(got) != 1 || got[0].ContextTokens != 1000 {
		t.Errorf("models = %v, want a with the engine's max_model_len", got)
	}
}

// TestModelFetchFailuresAfterSuccess pins that a served list survives MaxScrapeFailures-1
// failed fetches, and that the engine then turns unhealthy but keeps advertising it.
func TestModelFetchFailuresAfterSuccess(t *testing.T) {
	f := newFake(t)
	e := newEngine(t, f, KindOpenAI, func(c *Config) { c.MaxScrapeFailures = 2; c.ScrapeInterval = 10 * time.Millisecond })
	f.setModels(http.StatusInternalServerError)
	if err := e.refreshModels(context.Background(), false); err == nil || !e.State().Healthy {
		t.Errorf("one failed fetch: err %v, healthy %v; want an error and still healthy", err, e.State().Healthy)
	}
	if want := min(e.cfg.ScrapeInterval, e.cfg.ModelsInterval); e.nextModelsFetch() != want {
		t.Errorf("next fetch in %v after a failure, want %v", e.nextModelsFetch(), want)
	}
	_ = e.refreshModels(context.Background(), false)
	if e.State().Healthy || len(e.Models()) != 2 {
		t.Errorf("two failed fetches: healthy %v, models %v; want unhealthy with the last list", e.State().Healthy, e.Models())
	}
	f.setModels(0, "a")
	if err := e.refreshModels(context.Background(), false); err != nil || !e.State().Healthy || e.nextModelsFetch() != e.cfg.ModelsInterval {
		t.Errorf("after recovery: %v, healthy %v, next in %v", err, e.State().Healthy, e.nextModelsFetch())
	}
}

func TestNewValidates(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
	}{
		{"kind", func(c *Config) { c.Kind = "triton" }},
		{"scheme", func(c *Config) { c.BaseURL = "ftp://x" }},
		{"no host", func(c *Config) { c.BaseURL = "http://" }},
		{"model name", func(c *Config) { c.Models = []engine.Model{{ContextTokens: 5}} }},
		{"model context", func(c *Config) { c.Models = []engine.Model{{Name: "m", ContextTokens: -1}} }},
		{"negative", func(c *Config) { c.ScrapeInterval = -1 }},
		{"negative models interval", func(c *Config) { c.ModelsInterval = -1 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tt.mod(&cfg)
			if _, err := New(cfg); err == nil {
				t.Error("New accepted a bad config")
			}
		})
	}
	e, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if e.Close() != nil || e.Close() != nil {
		t.Error("Close before Start failed")
	}
	if !errors.Is(e.Start(context.Background()), ErrStarted) {
		t.Error("Start after Close did not fail")
	}
}

// TestForceStreaming: the engine gets the client's body with streaming and usage forced on
// and every other byte as sent (fields the node does not know, order, spacing, escapes).
func TestForceStreaming(t *testing.T) {
	tests := []struct {
		name string
		req  engine.Request
		want string
	}{
		{"non-streaming client", engine.Request{Body: []byte(`{"model":"m","stream":false,"temperature":0.5,"messages":[{"role":"user","content":"x"}]}`)},
			`{"model":"m","stream":true,"temperature":0.5,"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}`},
		{"streaming client with usage is unchanged", engine.Request{Body: []byte(` {"model" : "m", "stream": true, "stream_options" : {"include_usage": true}, "top_k": 4 }` + "\n")},
			`{"model" : "m", "stream": true, "stream_options" : {"include_usage": true}, "top_k": 4 }`},
		{"keeps other stream options", engine.Request{Body: []byte(`{"model":"m","stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":true}}`)},
			`{"model":"m","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`},
		{"adds include_usage", engine.Request{Body: []byte(`{"model":"m","stream_options":{"include_obfuscation":false}}`)},
			`{"model":"m","stream_options":{"include_obfuscation":false,"include_usage":true},"stream":true}`},
		{"empty stream options", engine.Request{Body: []byte(`{"model":"m","stream_options":{ }}`)},
			`{"model":"m","stream_options":{ "include_usage":true},"stream":true}`},
		{"null stream options", engine.Request{Body: []byte(`{"model":"m","stream_options":null}`)},
			`{"model":"m","stream_options":{"include_usage":true},"stream":true}`},
		{"vLLM fields and escapes untouched", engine.Request{Body: []byte(`{"stream":null,"model":"m","prompt":"<a> & \u00e9","top_k":-1,"min_p":0.050,` +
			`"guided_json":{"type":"object"},"chat_template_kwargs":{"enable_thinking":false},"x":1,"x":2}`)},
			`{"stream":true,"model":"m","prompt":"<a> & \u00e9","top_k":-1,"min_p":0.050,` +
				`"guided_json":{"type":"object"},"chat_template_kwargs":{"enable_thinking":false},"x":1,"x":2,"stream_options":{"include_usage":true}}`},
		{"empty object", engine.Request{Body: []byte(`{}`)}, `{"stream":true,"stream_options":{"include_usage":true}}`},
		{"synthesised completion", engine.Request{Endpoint: engine.Completion, Model: "m", Prompt: []byte("hi"), MaxTokens: 3, Stop: []string{"."}},
			`{"max_tokens":3,"model":"m","prompt":"hi","stop":["."],"stream":true,"stream_options":{"include_usage":true}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ForceStreaming(&tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
			if !json.Valid(got) {
				t.Errorf("not JSON: %s", got)
			}
		})
	}
	for _, bad := range []string{`[1]`, `{"a":1} {}`, `{"a":`, `"s"`} {
		if _, err := ForceStreaming(&engine.Request{Body: []byte(bad)}); !errors.Is(err, engine.ErrRejected) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}

func sse(w http.ResponseWriter, events ...string) {
	w.Header().Set("Content-Type", "text/event-stream")
	for _, e := range events {
		fmt.Fprintf(w, "data: %s\n\n", e)
		w.(http.Flusher).Flush()
	}
}

const (
	usageEvent = `{"id":"x","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12,"prompt_tokens_details":{"cached_tokens":8}}}`
)

func TestGenerateStreams(t *testing.T) {
	tests := []struct {
		name     string
		endpoint engine.Endpoint
		path     string
		events   []string
		want     []engine.Chunk
		wantErr  error
	}{
		{name: "chat", endpoint: engine.Chat, path: "/v1/chat/completions", events: []string{
			`{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}],"usage":null}`,
			`{"choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}],"usage":null}`,
			`{"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":null}],"usage":null}`,
			`{"choices":[{"index":0,"delta":{},"finish_reason":"length"}],"usage":null}`,
			usageEvent, "[DONE]"},
			want: []engine.Chunk{{Text: "Hel"}, {Text: "lo"}, {FinishReason: "length",
				Usage: &engine.Usage{PromptTokens: 10, CompletionTokens: 2, CachedTokens: 8}}}},
		{name: "completion", endpoint: engine.Completion, path: "/v1/completions", events: []string{
			`{"choices":[{"index":0,"text":"ab","finish_reason":null}]}`,
			`{"choices":[{"index":0,"text":"c","finish_reason":"stop"}]}`,
			usageEvent, "[DONE]"},
			want: []engine.Chunk{{Text: "ab"}, {Text: "c", FinishReason: "stop",
				Usage: &engine.Usage{PromptTokens: 10, CompletionTokens: 2, CachedTokens: 8}}}},
		{name: "chat logprobs", endpoint: engine.Chat, path: "/v1/chat/completions", events: []string{
			`{"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":{"content":[{"token":"Hi","logprob":-0.5,"bytes":[72,105],` +
				`"top_logprobs":[{"token":"Hi","logprob":-0.5,"bytes":[72,105]},{"token":"Yo","logprob":-1.5,"bytes":[89,111]}]}]},"finish_reason":null}]}`,
			`{"choices":[{"index":0,"delta":{"content":"!"},"logprobs":{"content":[{"token":"!","logprob":-0.25,"top_logprobs":[]}]},"finish_reason":"stop"}]}`,
			usageEvent, "[DONE]"},
			want: []engine.Chunk{
				{Text: "Hi", Logprobs: []engine.Logprob{{Token: "Hi", Logprob: -0.5, Top: []engine.TopLogprob{{Token: "Hi", Logprob: -0.5}, {Token: "Yo", Logprob: -1.5}}}}},
				{Text: "!", FinishReason: "stop", Usage: &engine.Usage{PromptTokens: 10, CompletionTokens: 2, CachedTokens: 8},
					Logprobs: []engine.Logprob{{Token: "!", Logprob: -0.25}}}}},
		{name: "completion logprobs with echo", endpoint: engine.Completion, path: "/v1/completions", events: []string{
			`{"choices":[{"index":0,"text":"ab","logprobs":{"tokens":["a","b"],"token_logprobs":[null,-2],"top_logprobs":[null,{"b":-2,"c":-3}],"text_offset":[0,1]},"finish_reason":null}]}`,
			`{"choices":[{"index":0,"text":"","finish_reason":"length"}]}`,
			`{"choices":[{"index":0,"text":"d","logprobs":{"tokens":["d"],"token_logprobs":[-0.1],"top_logprobs":[{"d":-0.1}],"text_offset":[2]},"finish_reason":null}]}`,
			usageEvent, "[DONE]"},
			want: []engine.Chunk{
				{Text: "ab", Logprobs: []engine.Logprob{{Token: "a", Unscored: true}, {Token: "b", Logprob: -2, Top: []engine.TopLogprob{{Token: "b", Logprob: -2}, {Token: "c", Logprob: -3}}}}},
				{Text: "d", FinishReason: "length", Usage: &engine.Usage{PromptTokens: 10, CompletionTokens: 2, CachedTokens: 8},
					Logprobs: []engine.Logprob{{Token: "d", Logprob: -0.1, Top: []engine.TopLogprob{{Token: "d", Logprob: -0.1}}}}}}},
		{name: "chat tool calls", endpoint: engine.Chat, path: "/v1/chat/completions", events: []string{
			`{"choices":[{"index":0,"delta":{"role":"assistant","content":null},"finish_reason":null}]}`,
			`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]},"finish_reason":null}]}`,
			`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]},"finish_reason":null}]}`,
			`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}},` +
				`{"index":1,"id":"call_2","type":"function","function":{"name":"lookup","arguments":"{}"}}]},"finish_reason":null}]}`,
			`{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
			usageEvent, "[DONE]"},
			want: []engine.Chunk{
				{ToolCalls: []engine.ToolCall{{ID: "call_1", Name: "get_weather"}}},
				{ToolCalls: []engine.ToolCall{{Arguments: `{"city":`}}},
				{ToolCalls: []engine.ToolCall{{Arguments: `"Paris"}`}, {Index: 1, ID: "call_2", Name: "lookup", Arguments: "{}"}}},
				{FinishReason: "tool_calls", Usage: &engine.Usage{PromptTokens: 10, CompletionTokens: 2, CachedTokens: 8}}}},
		{name: "whole tool call with the finish", endpoint: engine.Chat, path: "/v1/chat/completions", events: []string{
			`{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}`,
			usageEvent, "[DONE]"},
			want: []engine.Chunk{{FinishReason: "tool_calls", Usage: &engine.Usage{PromptTokens: 10, CompletionTokens: 2, CachedTokens: 8},
				ToolCalls: []engine.ToolCall{{ID: "c", Name: "f", Arguments: "{}"}}}}},
		{name: "no usage chunk", endpoint: engine.Chat, path: "/v1/chat/completions", events: []string{
			`{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}]}`, "[DONE]"},
			want: []engine.Chunk{{Text: "x", FinishReason: "stop"}}},
		{name: "truncated", endpoint: engine.Chat, path: "/v1/chat/completions", events: []string{
			`{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}`},
			want: []engine.Chunk{{Text: "x"}}, wantErr: ErrTruncated},
		{name: "done without finish", endpoint: engine.Chat, path: "/v1/chat/completions", events: []string{"[DONE]"},
			wantErr: ErrTruncated},
		{name: "error event", endpoint: engine.Chat, path: "/v1/chat/completions", events: []string{
			`{"error":{"message":"oom","type":"server_error","code":500}}`}, wantErr: ErrStream},
		{name: "garbage", endpoint: engine.Chat, path: "/v1/chat/completions", events: []string{`{`}, wantErr: errors.New("any")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			var path atomic.Value
			f.gen = func(w http.ResponseWriter, r *http.Request) {
				path.Store(r.URL.Path)
				sse(w, tt.events...)
			}
			e := newEngine(t, f, KindOpenAI, nil)
			st, err := e.Generate(context.Background(), &engine.Request{ID: "r1", Endpoint: tt.endpoint,
				Body: []byte(`{"model":"a","stream":false,"seed":3}`)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			body := <-f.bodies
			var sent map[string]any
			if err := json.Unmarshal(body, &sent); err != nil || sent["stream"] != true || sent["seed"] != 3.0 ||
				sent["stream_options"].(map[string]any)["include_usage"] != true {
				t.Errorf("engine got body %s", body)
			}
			if p := path.Load(); p != tt.path {
				t.Errorf("path %v, want %s", p, tt.path)
			}
			var got []engine.Chunk
			for {
				c, err := st.Recv()
				if err == io.EOF {
					if tt.wantErr != nil {
						t.Errorf("io.EOF, want %v", tt.wantErr)
					}
					break
				}
				if err != nil {
					if tt.wantErr == nil || (tt.wantErr.Error() != "any" && !errors.Is(err, tt.wantErr)) {
						t.Errorf("Recv: %v, want %v", err, tt.wantErr)
					}
					break
				}
				got = append(got, c)
			}
			if fmt.Sprintf("%+v", deref(got)) != fmt.Sprintf("%+v", deref(tt.want)) {
				t.Errorf("chunks\n got %+v\nwant %+v", deref(got), deref(tt.want))
			}
			if _, err := st.Recv(); err != io.EOF {
				t.Errorf("Recv after end = %v, want io.EOF", err)
			}
		})
	}
}

func deref(cs []engine.Chunk) []string {
	var out []string
	for _, c := range cs {
		s := fmt.Sprintf("%q/%s", c.Text, c.FinishReason)
		if c.Usage != nil {
			s += fmt.Sprintf("/%+v", *c.Usage)
		}
		if c.Logprobs != nil {
			s += fmt.Sprintf("/%+v", c.Logprobs)
		}
		if c.ToolCalls != nil {
			s += fmt.Sprintf("/calls%+v", c.ToolCalls)
		}
		out = append(out, s)
	}
	return out
}

func TestGenerateErrors(t *testing.T) {
	tests := []struct {
		name     string
		status   int
		body     string
		sentinel error
		apiCode  string
		apiMsg   string
	}{
		{"openai 400", 400, `{"error":{"message":"max_tokens too big","type":"BadRequestError","param":"max_tokens","code":400}}`,
			engine.ErrRejected, "invalid_request", "max_tokens too big"},
		{"string code 404", 404, `{"error":{"message":"no such model","type":"invalid_request_error","param":null,"code":"model_not_found"}}`,
			engine.ErrRejected, "model_not_found", "no such model"},
		{"vllm 404, numeric code", 404, `{"error":{"message":"The model ` + "`x`" + ` does not exist.","type":"NotFoundError","param":null,"code":404}}`,
			engine.ErrRejected, "model_not_found", "The model `x` does not exist."},
		{"older vllm, top level", 400, `{"object":"error","message":"bad n","type":"BadRequestError","param":"n","code":400}`,
			engine.ErrRejected, "invalid_request", "bad n"},
		{"plain-text 404", 404, `404 page not found`, engine.ErrRejected, "not_found", "404 page not found"},
		{"413", 413, `{"error":{"message":"too big","code":null}}`, engine.ErrRejected, "body_too_large", "too big"},
		{"string status code", 400, `{"error":{"message":"no","code":"400"}}`, engine.ErrRejected, "invalid_request", "no"},
		{"tgi 422", 422, `{"error":"Input validation error","error_type":"validation"}`, engine.ErrRejected, "invalid_request", "Input validation error"},
		{"tgi 429", 429, `{"error":"Model is overloaded","error_type":"overloaded"}`, engine.ErrRejected, "engine_overloaded", "Model is overloaded"},
		{"plain 429", 429, `overloaded`, engine.ErrRejected, "engine_overloaded", "overloaded"},
		{"401: the node's credentials", 401, `{"error":{"message":"bad key","code":"invalid_api_key"}}`, engine.ErrUnavailable, "engine_error", ""},
		{"503", 503, `{"error":{"message":"down"}}`, engine.ErrUnavailable, "engine_error", ""},
		{"500", 500, ``, engine.ErrUnavailable, "engine_error", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			f.gen = func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			}
			e := newEngine(t, f, KindOpenAI, nil)
			_, err := e.Generate(context.Background(), &engine.Request{Body: []byte(`{"model":"a"}`)})
			var se *StatusError
			if !errors.Is(err, tt.sentinel) || !errors.As(err, &se) || se.Status != tt.status {
				t.Fatalf("err = %v, want %v with status %d", err, tt.sentinel, tt.status)
			}
			api := se.APIError()
			if api.Code != tt.apiCode || (tt.apiMsg != "" && api.Message != tt.apiMsg) {
				t.Errorf("api error %+v", api)
			}
			if tt.apiCode != "engine_error" && api.Status != tt.status {
				t.Errorf("relayed status %d, want %d", api.Status, tt.status)
			}
			if tt.apiCode == "engine_error" && api.Status != http.StatusBadGateway {
				t.Errorf("%d relayed as %d, want 502", tt.status, api.Status)
			}
			if got := e.State().Running; got != 0 {
				t.Errorf("in flight after refusal = %d", got)
			}
		})
	}
}

func TestGenerateConnectionRefused(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	cfg := DefaultConfig()
	cfg.BaseURL, cfg.Kind = url, KindOpenAI
	cfg.Models = []engine.Model{{Name: "a", ContextTokens: 10}}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	_, err = e.Generate(context.Background(), &engine.Request{Body: []byte(`{"model":"a"}`)})
	if !errors.Is(err, engine.ErrUnavailable) {
		t.Errorf("err = %v, want ErrUnavailable", err)
	}
	cfg.Kind = KindVLLM
	e2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e2.Close()
	if err := e2.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if e2.State().Healthy {
		t.Error("healthy with the engine down")
	}
}

func TestCancellationReachesEngine(t *testing.T) {
	tests := []struct {
		name   string
		cancel func(context.CancelFunc, engine.Stream)
	}{
		{"context", func(c context.CancelFunc, _ engine.Stream) { c() }},
		{"close", func(_ context.CancelFunc, s engine.Stream) { s.Close() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			gone := make(chan struct{})
			f.gen = func(w http.ResponseWriter, r *http.Request) {
				sse(w, `{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}`)
				<-r.Context().Done()
				close(gone)
			}
			e := newEngine(t, f, KindOpenAI, nil)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			st, err := e.Generate(ctx, &engine.Request{Body: []byte(`{"model":"a"}`)})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if c, err := st.Recv(); err != nil || c.Text != "x" {
				t.Fatalf("Recv = %+v, %v", c, err)
			}
			tt.cancel(cancel, st)
			select {
			case <-gone:
			case <-time.After(10 * time.Second):
				t.Fatal("engine never saw the cancellation")
			}
			if _, err := st.Recv(); !errors.Is(err, context.Canceled) {
				t.Errorf("Recv after cancel = %v, want a cancellation error", err)
			}
			if got := e.State().Running; got != 0 {
				t.Errorf("in flight after cancel = %d", got)
			}
		})
	}
}

func TestParseMetrics(t *testing.T) {
	m, err := parseMetrics(strings.NewReader(`# HELP a x
a{l="q\"uo,te}",m="2"} 1.5 1700000000
b 2
b{x="y"} NaN
c{broken 3
d{} +Inf
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(m["a"]) != 1 || m["a"][0].labels["l"] != `q"uo,te}` || m["a"][0].labels["m"] != "2" || m["a"][0].value != 1.5 {
		t.Errorf("a = %+v", m["a"])
	}
	if len(m["b"]) != 2 || m["c"] != nil || len(m["d"]) != 1 {
		t.Errorf("parsed %+v", m)
	}
}
