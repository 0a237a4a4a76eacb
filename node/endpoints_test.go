package node_test

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/engine/sim"
)

type embeddingsResponse struct {
	Object string `json:"object"`
	Model  string `json:"model"`
	Data   []struct {
		Object    string          `json:"object"`
		Index     int             `json:"index"`
		Embedding json.RawMessage `json:"embedding"`
	} `json:"data"`
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

func floats(t *testing.T, raw json.RawMessage) []float32 {
	t.Helper()
	var v []float32
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("embedding %s: %v", raw, err)
	}
	return v
}

// TestEmbeddingsOnTheEmbeddedEngine: the embedded engine answers POST /v1/embeddings in
// OpenAI's shape, with unit vectors of sim.EmbeddingDims seeded by the text (the same on
// every node), dimensions and base64 honoured and usage counting the input; a node that does
// not serve the model forwards the request to one that does and relays the answer; token ids
// are refused, wrong methods are 405, and the counters reconcile.
func TestEmbeddingsOnTheEmbeddedEngine(t *testing.T) {
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		if i == 1 {
			cfg.Models = []string{"another-model"} // the ingress that must forward
		}
	})
	urls := tn.URLs()
	texts := []string{"the quick brown fox", "jumps over the lazy dog"}
	body, _ := json.Marshal(map[string]any{"model": model, "input": texts})
	var first [][]float32
	for i, url := range urls {
		resp := post(t, url, "/v1/embeddings", string(body), nil)
		b := readAll(t, resp)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(node.HeaderNode) != "n1" {
			t.Fatalf("via n%d: status %d node %q: %s", i+1, resp.StatusCode, resp.Header.Get(node.HeaderNode), b)
		}
		var er embeddingsResponse
		if err := json.Unmarshal(b, &er); err != nil {
			t.Fatal(err)
		}
		want := kvindex.Tokens(len(texts[0])) + kvindex.Tokens(len(texts[1]))
		if er.Object != "list" || er.Model != model || len(er.Data) != 2 || er.Usage.PromptTokens != want || er.Usage.TotalTokens != want {
			t.Fatalf("via n%d: response %s", i+1, b)
		}
		var got [][]float32
		for j, d := range er.Data {
			v := floats(t, d.Embedding)
			if d.Object != "embedding" || d.Index != j || len(v) != sim.EmbeddingDims {
				t.Fatalf("item %d: object %q index %d, %d values", j, d.Object, d.Index, len(v))
			}
			var sq float64
			for _, x := range v {
				sq += float64(x) * float64(x)
			}
			if math.Abs(sq-1) > 1e-4 {
				t.Errorf("item %d has length² %v", j, sq)
			}
			got = append(got, v)
		}
		if slices.Equal(got[0], got[1]) {
			t.Error("two texts, one vector")
		}
		if first == nil {
			first = got
		} else if !slices.Equal(first[0], got[0]) || !slices.Equal(first[1], got[1]) {
			t.Error("the same text gave another vector through the other node")
		}
	}
	if got := metric(t, urls[1], "kvmesh_forward_attempts_total", `result="accepted"`); got != 1 {
		t.Errorf("n2 forwarded %v times, want 1", got)
	}

	t.Run("dimensions and base64", func(t *testing.T) {
		resp := post(t, urls[1], "/v1/embeddings", `{"model":"`+model+`","input":"the quick brown fox","dimensions":8,"encoding_format":"base64"}`, nil)
		b := readAll(t, resp)
		var er embeddingsResponse
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &er) != nil || len(er.Data) != 1 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		var s string
		if err := json.Unmarshal(er.Data[0].Embedding, &s); err != nil {
			t.Fatalf("not base64: %s", er.Data[0].Embedding)
		}
		raw, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(raw) != 8*4 {
			t.Fatalf("%d bytes, %v", len(raw), err)
		}
		want := sim.Embedding(model, "the quick brown fox", 8)
		for i := range want {
			if got := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])); got != want[i] {
				t.Errorf("value %d = %v, want %v", i, got, want[i])
			}
		}
	})

	refusals := []struct {
		name, body, code, param string
	}{
		{"token ids", `{"model":"` + model + `","input":[1,2,3]}`, "unsupported_parameter", "input"},
		{"too many dimensions", fmt.Sprintf(`{"model":"%s","input":"x","dimensions":%d}`, model, sim.EmbeddingDims+1), "invalid_parameter", "dimensions"},
		{"empty input", `{"model":"` + model + `","input":[]}`, "invalid_parameter", "input"},
		{"no model", `{"input":"x"}`, "invalid_parameter", "model"},
	}
	for _, tt := range refusals {
		for i, url := range urls {
			t.Run(fmt.Sprintf("%s via n%d", tt.name, i+1), func(t *testing.T) {
				resp := post(t, url, "/v1/embeddings", tt.body, nil)
				e := decodeError(t, readAll(t, resp))
				if resp.StatusCode != http.StatusBadRequest || e.Error.Code != tt.code || e.Error.Param == nil || *e.Error.Param != tt.param {
					t.Errorf("status %d error %+v, want 400 %s naming %s", resp.StatusCode, e.Error, tt.code, tt.param)
				}
			})
		}
	}
	resp := post(t, urls[0], "/v1/embeddings", `{"model":"nope","input":"x"}`, nil)
	if e := decodeError(t, readAll(t, resp)); resp.StatusCode != http.StatusNotFound || e.Error.Code != "model_not_found" {
		t.Errorf("unknown model: %d %+v", resp.StatusCode, e.Error)
	}

	t.Run("responses refused", func(t *testing.T) {
		for _, url := range urls {
			resp := post(t, url, "/v1/responses", `{"model":"`+model+`","input":"hi"}`, nil)
			if e := decodeError(t, readAll(t, resp)); resp.StatusCode != http.StatusBadRequest || e.Error.Code != node.CodeUnsupportedEndpoint {
				t.Errorf("status %d error %+v, want 400 %s", resp.StatusCode, e.Error, node.CodeUnsupportedEndpoint)
			}
		}
	})
	t.Run("wrong methods", func(t *testing.T) {
		for _, path := range []string{"/v1/embeddings", "/v1/responses"} {
			resp, b := get(t, urls[0]+path)
			if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" || decodeError(t, b).Error.Code != node.CodeMethodNotAllowed {
				t.Errorf("GET %s: %d Allow %q: %s", path, resp.StatusCode, resp.Header.Get("Allow"), b)
			}
		}
	})
	reconciles(t, urls)
	if got := metric(t, urls[0], "kvmesh_requests_completed_total", `endpoint="embeddings"`); got != 1 {
		t.Errorf("n1 completed %v embeddings requests it ingested, want 1", got)
	}
}

// respEngine is an external engine that lists one model and serves embeddings and the
// Responses API, recording what it is sent.
type respEngine struct {
	srv *httptest.Server

	mu     sync.Mutex
	bodies []string // of /v1/embeddings and /v1/responses, in order
	seq    int
}

// Its fixed embeddings answer.
const engineEmbeddings = `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.6,0.8]}],"model":"` + model + `","usage":{"prompt_tokens":2,"total_tokens":2}}`

func newRespEngine(t *testing.T, name string) *respEngine {
	t.Helper()
	f := &respEngine{}
	record := func(r *http.Request) string {
		b, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		defer f.mu.Unlock()
		f.bodies = append(f.bodies, string(b))
		if r.URL.Path != "/v1/responses" {
			return ""
		}
		f.seq++ // the engine's response ids: resp_<name>1, resp_<name>2, ...
		return fmt.Sprintf("resp_%s%d", name, f.seq)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","max_model_len":4096}]}`, model)
	})
	mux.HandleFunc("POST /v1/embeddings", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(f.last(), `"bad"`) {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":{"message":"this model does not embed","type":"BadRequestError","param":null,"code":"not_an_embedding_model"}}`)
			return
		}
		io.WriteString(w, engineEmbeddings)
	})
	mux.HandleFunc("POST /v1/responses", func(w http.ResponseWriter, r *http.Request) {
		id := record(r)
		if strings.Contains(f.last(), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			for _, e := range []string{
				`event: response.created` + "\n" + `data: {"type":"response.created","response":{"id":"` + id + `","object":"response","status":"in_progress"}}`,
				`event: response.output_text.delta` + "\n" + `data: {"type":"response.output_text.delta","item_id":"msg_1","delta":"hi"}`,
				`event: response.completed` + "\n" + `data: {"type":"response.completed","response":{"id":"` + id + `","object":"response","status":"completed"}}`,
			} {
				fmt.Fprintf(w, "%s\n\n", e)
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":%q,"object":"response","status":"completed","output":[{"id":"msg_1","type":"message","content":[{"type":"output_text","text":"hi"}]}]}`, id)
	})
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *respEngine) last() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.bodies) == 0 {
		return ""
	}
	return f.bodies[len(f.bodies)-1]
}

func (f *respEngine) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.bodies)
}

// TestEmbeddingsAndResponsesPassToExternalEngines: in a mesh whose nodes each front their own
// external engine, an embeddings or Responses request reaches the engine byte for byte and
// its answer (a 4xx included) reaches the client as the engine sent it, but for the response
// id, which carries the node that ran it; a request continuing that response
// (previous_response_id) goes to that node, whichever node the client called, and its engine
// gets its own id back; once that node has left, the continuation is a 404.
func TestEmbeddingsAndResponsesPassToExternalEngines(t *testing.T) {
	engines := []*respEngine{newRespEngine(t, "a"), newRespEngine(t, "b")}
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		cfg.Engine, cfg.EngineKind, cfg.ModelsInterval = engines[i].srv.URL, "openai", 10*time.Millisecond
	})
	urls := tn.URLs()

	t.Run("embeddings", func(t *testing.T) {
		body := `{"model":"` + model + `", "input":["a","b"],"truncate_prompt_tokens":4}`
		resp := post(t, urls[1], "/v1/embeddings", body, nil)
		b := readAll(t, resp)
		if resp.StatusCode != http.StatusOK || string(b) != engineEmbeddings || resp.Header.Get(node.HeaderNode) != "n2" {
			t.Fatalf("status %d node %q: %s", resp.StatusCode, resp.Header.Get(node.HeaderNode), b)
		}
		if got := engines[1].last(); got != body {
			t.Errorf("the engine got %s, want %s", got, body)
		}
		resp = post(t, urls[0], "/v1/embeddings", `{"model":"`+model+`","input":"bad"}`, nil)
		e := decodeError(t, readAll(t, resp))
		if resp.StatusCode != http.StatusBadRequest || e.Error.Code != "not_an_embedding_model" || e.Error.Message != "this model does not embed" {
			t.Errorf("the engine's 400 came back as %d %+v", resp.StatusCode, e.Error)
		}
		// Token ids are the engine's to judge.
		resp = post(t, urls[0], "/v1/embeddings", `{"model":"`+model+`","input":[[1,2],[3]]}`, nil)
		if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Errorf("token ids: %d %s", resp.StatusCode, b)
		}
	})

	var prev string // a response n2 ran
	t.Run("responses", func(t *testing.T) {
		resp := post(t, urls[1], "/v1/responses", `{"model":"`+model+`","input":"hi"}`, nil)
		b := readAll(t, resp)
		var r struct {
			ID     string            `json:"id"`
			Output []json.RawMessage `json:"output"`
		}
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &r) != nil || resp.Header.Get(node.HeaderNode) != "n2" {
			t.Fatalf("status %d node %q: %s", resp.StatusCode, resp.Header.Get(node.HeaderNode), b)
		}
		if !strings.HasPrefix(r.ID, "resp_") || !strings.HasSuffix(r.ID, "_resp_b1") || len(r.Output) != 1 {
			t.Fatalf("response id %q (output %d): want n2's tag on the engine's resp_b1", r.ID, len(r.Output))
		}
		prev = r.ID

		before := engines[0].count()
		cont := `{"model":"` + model + `","input":"and then?","previous_response_id":"` + prev + `","stream":true}`
		resp = post(t, urls[0], "/v1/responses", cont, nil)
		b = readAll(t, resp)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(node.HeaderNode) != "n2" {
			t.Fatalf("continuation via n1: status %d node %q: %s", resp.StatusCode, resp.Header.Get(node.HeaderNode), b)
		}
		if engines[0].count() != before {
			t.Error("n1's engine was sent the continuation of n2's response")
		}
		if want := strings.Replace(cont, prev, "resp_b1", 1); engines[1].last() != want {
			t.Errorf("n2's engine got %s, want %s", engines[1].last(), want)
		}
		events := sseEvents(t, b)
		next := strings.TrimSuffix(prev, "resp_b1") + "resp_b2"
		if len(events) != 3 || !strings.Contains(events[0], `"id":"`+next+`"`) || !strings.Contains(events[2], `"id":"`+next+`"`) ||
			strings.Contains(string(b), `"resp_b2"`) {
			t.Errorf("stream does not carry the tagged id %s everywhere: %s", next, b)
		}
		if !strings.Contains(string(b), "event: response.output_text.delta\ndata: ") {
			t.Errorf("the stream's event lines were not relayed: %s", b)
		}
	})

	t.Run("unknown previous response", func(t *testing.T) {
		for _, id := range []string{"resp_0123456789abcdef_x", "resp_abc", "chatcmpl-1"} {
			resp := post(t, urls[0], "/v1/responses", `{"model":"`+model+`","previous_response_id":"`+id+`"}`, nil)
			e := decodeError(t, readAll(t, resp))
			if resp.StatusCode != http.StatusNotFound || e.Error.Code != node.CodePreviousResponseNotFound {
				t.Errorf("%s: %d %+v", id, resp.StatusCode, e.Error)
			}
		}
	})

	reconciles(t, urls)
	if got := metric(t, urls[0], "kvmesh_requests_refused_total", `code="engine_rejected"`); got != 1 {
		t.Errorf("the engine's 400 counted %v times as engine_rejected, want 1", got)
	}

	t.Run("owner gone", func(t *testing.T) {
		if prev == "" {
			t.Skip("no response to continue")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := tn.Nodes[1].Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, 10*time.Second, "n1 sees n2 leave", func() bool {
			for _, m := range tn.Nodes[0].Members() {
				if m.Name == "n2" && (m.Liveness == gossip.LivenessAlive || m.Liveness == gossip.LivenessSuspect) {
					return false
				}
			}
			return true
		})
		resp := post(t, urls[0], "/v1/responses", `{"model":"`+model+`","previous_response_id":"`+prev+`"}`, nil)
		e := decodeError(t, readAll(t, resp))
		if resp.StatusCode != http.StatusNotFound || e.Error.Code != node.CodePreviousResponseNotFound || !strings.Contains(e.Error.Message, "left the mesh") {
			t.Errorf("continuation of a departed node's response: %d %+v", resp.StatusCode, e.Error)
		}
		reconciles(t, urls[:1])
	})
}

// TestEmbeddingsGoThroughIdentity: an embeddings request needs a valid API key and pays its
// input's tokens into the key's bucket, so a key's rate bounds embeddings as it does
// generations.
func TestEmbeddingsGoThroughIdentity(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "keys")
	// A bucket of 600 tokens refilling at 1 token/s: two inputs of 250 tokens pass, a third does not.
	if err := os.WriteFile(keys, []byte(admit.HashKey("sk-alpha")+" alpha 1 600\n"+scrapeKeyLine), 0o600); err != nil {
		t.Fatal(err)
	}
	tn := startNet(t, 1, func(i int, cfg *node.Config) { cfg.APIKeysFile = keys })
	url := tn.URLs()[0]
	body := `{"model":"` + model + `","input":"` + strings.Repeat("x", 1000) + `"}`
	if kvindex.Tokens(1000) != 250 {
		t.Fatalf("the input is %d tokens; the bucket's arithmetic below wants 250", kvindex.Tokens(1000))
	}
	for _, key := range []string{"", "Bearer sk-wrong"} {
		resp := post(t, url, "/v1/embeddings", body, map[string]string{"Authorization": key})
		if e := decodeError(t, readAll(t, resp)); resp.StatusCode != http.StatusUnauthorized || e.Error.Code != "invalid_api_key" {
			t.Errorf("key %q: %d %+v", key, resp.StatusCode, e.Error)
		}
	}
	var statuses []int
	for range 3 {
		resp := post(t, url, "/v1/embeddings", body, map[string]string{"Authorization": "Bearer sk-alpha"})
		b := readAll(t, resp)
		statuses = append(statuses, resp.StatusCode)
		if resp.StatusCode == http.StatusTooManyRequests && (decodeError(t, b).Error.Code != "rate_limited" || resp.Header.Get("Retry-After") == "") {
			t.Errorf("429 without rate_limited and Retry-After: %s", b)
		}
	}
	if !slices.Equal(statuses, []int{200, 200, 429}) {
		t.Errorf("statuses %v, want [200 200 429]", statuses)
	}
	reconciles(t, []string{url})
}
