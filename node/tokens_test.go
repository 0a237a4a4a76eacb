package node_test

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node"
)

// startDoubleTokenEngine starts an external engine serving calibModel (a 4,096-token context)
// whose tokeniser makes twice the tokens of kvmesh's 4-byte rule: its usage.prompt_tokens is
// twice kvindex.Tokens of the prompt as kvmesh renders it.
func startDoubleTokenEngine(t *testing.T) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","max_model_len":4096}]}`, calibModel)
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Messages []kvindex.Message `json:"messages"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Errorf("fake engine: %v", err)
		}
		prompt := 2 * kvindex.Tokens(len(kvindex.RenderChat(nil, req.Messages)))
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range []string{
			`{"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}`,
			fmt.Sprintf(`{"id":"x","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":1,"total_tokens":%d}}`, prompt, prompt+1),
			"[DONE]",
		} {
			fmt.Fprintf(w, "data: %s\n\n", e)
		}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

const calibModel = "double-tokens"

// TestContextBudgetFollowsTheEnginesTokens: a node in front of an engine whose tokeniser makes
// twice kvmesh's estimate of a prompt's tokens learns it from the engine's usage, and its
// context budget then counts prompts in the engine's tokens. A request that fits the context
// at 4 bytes a token (about 2,000 + 1,500 of 4,096) is served before, and refused
// context_length_exceeded after (about 4,000 + 1,500), at the node itself and, forwarded, by
// it as the owner on behalf of an ingress that serves another model and learned nothing.
func TestContextBudgetFollowsTheEnginesTokens(t *testing.T) {
	engineURL := startDoubleTokenEngine(t)
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		if i == 0 {
			cfg.Engine, cfg.EngineKind, cfg.ModelsInterval = engineURL, "openai", 10*time.Millisecond
			return
		}
		cfg.Models = []string{"another-model"} // the ingress that must forward
	})
	owner, ingress := tn.URLs()[0], tn.URLs()[1]
	body := func(content string, maxTokens int) string {
		return strings.Replace(chatBody(content, maxTokens, false), model, calibModel, 1)
	}
	long := body(longPrompt("calibrate", 2000), 1500)
	bytesPerToken := func() float64 {
		return metric(t, owner, "kvmesh_tokens_bytes_per_token", `model="`+calibModel+`"`)
	}

	for _, url := range []string{owner, ingress} {
		resp := post(t, url, "/v1/chat/completions", long, nil)
		if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("before calibration, via %s: %d %s; want 200 (about 2,000 + 1,500 of 4,096 tokens)", url, resp.StatusCode, b)
		}
	}
	// Samples are learned after the response is written: wait for them.
	poll.Until(t, 5*time.Second, "the 4-byte rule in the gauge while samples are too few", func() bool {
		return bytesPerToken() == kvindex.BytesPerToken
	})
	for i := range kvindex.DefaultCalibrationMinSamples {
		resp := post(t, owner, "/v1/chat/completions", body(longPrompt(fmt.Sprint("short", i), 200), 8), nil)
		if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("short request %d: %d %s", i, resp.StatusCode, b)
		}
	}
	poll.Until(t, 5*time.Second, "the learned 2 bytes per token in the gauge", func() bool {
		return math.Abs(bytesPerToken()-2) < 0.01
	})

	// The owner publishes the figure; the ingress counts the model's prompts with it too.
	poll.Until(t, 5*time.Second, "the owner's figure in the ingress's view", func() bool {
		for _, m := range tn.Nodes[1].Members() {
			for _, mi := range m.State.Models {
				if m.Name == tn.Nodes[0].Name() && mi.Name == calibModel && math.Abs(mi.BytesPerToken-2) < 0.01 {
					return true
				}
			}
		}
		return false
	})
	tn.Nodes[1].RefreshMeshTokens() // rather than wait for the room loop's second
	ownerRefused := metric(t, owner, "kvmesh_admission_decisions_total", `reason="context_length_exceeded"`)
	ingressRefused := metric(t, ingress, "kvmesh_admission_decisions_total", `reason="context_length_exceeded"`)
	for _, url := range []string{owner, ingress} {
		resp := post(t, url, "/v1/chat/completions", long, nil)
		b := readAll(t, resp)
		if resp.StatusCode != http.StatusBadRequest || decodeError(t, b).Error.Code != "context_length_exceeded" {
			t.Errorf("after calibration, via %s: %d %s; want 400 context_length_exceeded (about 4,000 + 1,500 of 4,096 tokens)",
				url, resp.StatusCode, b)
		}
	}
	// Each refused where it was counted: the owner its own client's, the ingress its own.
	if got := metric(t, owner, "kvmesh_admission_decisions_total", `reason="context_length_exceeded"`) - ownerRefused; got != 1 {
		t.Errorf("the owner refused %v long prompts for context, want 1 (its own client's only)", got)
	}
	if got := metric(t, ingress, "kvmesh_admission_decisions_total", `reason="context_length_exceeded"`) - ingressRefused; got != 1 {
		t.Errorf("the ingress refused %v long prompts for context itself, want 1", got)
	}
	// A short request still runs: only the count changed.
	resp := post(t, ingress, "/v1/chat/completions", body("hello", 8), nil)
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Errorf("a short request after calibration: %d %s", resp.StatusCode, b)
	}
	if got := metric(t, ingress, "kvmesh_tokens_bytes_per_token", ""); got != 0 {
		t.Errorf("the ingress, whose engine ran none of the model, reports %v bytes per token; want no series", got)
	}
}
