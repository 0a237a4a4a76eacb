package node_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet"
)

// startBehindPeer starts n1 in front of the external engine at url, of kind, and n2 on another
// model, an ingress that must forward to n1; mod, if set, configures both.
func startBehindPeer(t *testing.T, url, kind string, mod func(*node.Config)) *testnet.Net {
	t.Helper()
	return startNet(t, 2, func(i int, cfg *node.Config) {
		if mod != nil {
			mod(cfg)
		}
		if i == 0 {
			cfg.Engine, cfg.EngineKind = url, kind
			return
		}
		cfg.Models = []string{"another-model"}
	})
}

// TestExternalEngineGetsAdmittedMaxTokens: an external engine is sent the max_tokens admission
// decided, not only the client's: the tenant's or the mesh's default when the client sent
// none (vLLM would otherwise generate to the end of the context, past the KV reserved and
// the tokens charged), the clamped value in place of a larger one, and a cap within the limit
// as sent; whether the client came to the engine's node or to a peer that forwarded it.
func TestExternalEngineGetsAdmittedMaxTokens(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "keys")
	file := admit.HashKey("sk-batch") + " batch\n" + admit.HashKey("sk-other") + " other\n" + scrapeKeyLine
	if err := os.WriteFile(keys, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	f := startRecordingEngine(t)
	tn := startBehindPeer(t, f.url, "vllm", func(cfg *node.Config) {
		cfg.APIKeysFile = keys
		cfg.Admit.Budget.MaxMaxTokens, cfg.Admit.Budget.ClampMaxTokens = 200, true
		cfg.Admit.Tenants = map[string]admit.TenantConfig{"batch": {DefaultMaxTokens: 16}}
	})
	const chat = `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]`
	const forced = `"stream":true,"stream_options":{"include_usage":true}`
	tests := []struct {
		name, key, path, body, want string
	}{
		{"no max_tokens: the mesh's default, cut to the limit", "sk-other", "/v1/chat/completions", chat + `}`,
			chat + `,` + forced + `,"max_tokens":200}`},
		{"no max_tokens: the tenant's default", "sk-batch", "/v1/chat/completions", chat + `,"max_tokens":null}`,
			chat + `,"max_tokens":16,` + forced + `}`},
		{"clamped where it stands", "sk-other", "/v1/chat/completions", chat + `,"max_completion_tokens":5000,"top_k":4}`,
			chat + `,"max_completion_tokens":200,"top_k":4,` + forced + `,"max_tokens":200}`},
		{"within the limit: as sent", "sk-batch", "/v1/completions", `{"model":"` + model + `","prompt":"p","max_tokens":3}`,
			`{"model":"` + model + `","prompt":"p","max_tokens":3,` + forced + `}`},
	}
	for _, tt := range tests {
		for i, url := range tn.URLs() {
			t.Run(fmt.Sprintf("%s via n%d", tt.name, i+1), func(t *testing.T) {
				resp := post(t, url, tt.path, tt.body, map[string]string{"Authorization": "Bearer " + tt.key})
				if b := readAll(t, resp); resp.StatusCode != http.StatusOK || resp.Header.Get(node.HeaderNode) != "n1" {
					t.Fatalf("status %d node %q: %s", resp.StatusCode, resp.Header.Get(node.HeaderNode), b)
				}
				if got := <-f.bodies; string(got) != tt.want {
					t.Errorf("the engine got\n%s\nwant\n%s", got, tt.want)
				}
			})
		}
	}
}

// TestEmbeddingsAndResponsesGuardEngineFields: the fields a generation's client may not set
// on an external engine are guarded on /v1/embeddings and /v1/responses too: a client's
// kv_transfer_params (null is absent) is 400 invalid_parameter before any engine sees it, and
// a client's priority is removed from the body the engine gets, whichever node the client
// called.
func TestEmbeddingsAndResponsesGuardEngineFields(t *testing.T) {
	eng := newRespEngine(t, "a")
	tn := startBehindPeer(t, eng.srv.URL, "openai", nil)
	bodies := map[string]string{
		"/v1/embeddings": `{"model":"` + model + `","input":"hi"`,
		"/v1/responses":  `{"model":"` + model + `","input":"hi"`,
	}
	for path, body := range bodies {
		for i, url := range tn.URLs() {
			t.Run(fmt.Sprintf("%s via n%d", path, i+1), func(t *testing.T) {
				before := eng.count()
				resp := post(t, url, path, body+`,"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"10.9.9.9"}}`, nil)
				e := decodeError(t, readAll(t, resp))
				if resp.StatusCode != http.StatusBadRequest || e.Error.Code != "invalid_parameter" || e.Error.Param == nil ||
					*e.Error.Param != "kv_transfer_params" {
					t.Errorf("kv_transfer_params: %d %+v", resp.StatusCode, e.Error)
				}
				if eng.count() != before {
					t.Errorf("the engine was sent a client's kv_transfer_params: %s", eng.last())
				}
				resp = post(t, url, path, body+`,"priority":-1000,"kv_transfer_params":null,"user":"u"}`, nil)
				if b := readAll(t, resp); resp.StatusCode != http.StatusOK || resp.Header.Get(node.HeaderNode) != "n1" {
					t.Fatalf("status %d node %q: %s", resp.StatusCode, resp.Header.Get(node.HeaderNode), b)
				}
				if want := body + `,"kv_transfer_params":null,"user":"u"}`; eng.last() != want {
					t.Errorf("the engine got\n%s\nwant\n%s", eng.last(), want)
				}
			})
		}
	}
}

// TestExternalEngineIsSentNoClientPriority: without EnginePriority a client's priority field
// never reaches the engine: vLLM scheduling by priority would otherwise run a key's
// "priority": -1000 ahead of all it queues, past the key's max_priority. X-Kvmesh-Priority is
// how a client asks.
func TestExternalEngineIsSentNoClientPriority(t *testing.T) {
	f := startRecordingEngine(t)
	tn := startBehindPeer(t, f.url, "vllm", nil)
	const client = `{"priority":-1000,"model":"` + model + `","prompt":"p","max_tokens":2,"priority":5}`
	const want = `{"model":"` + model + `","prompt":"p","max_tokens":2,"stream":true,"stream_options":{"include_usage":true}}`
	for i, url := range tn.URLs() {
		resp := post(t, url, "/v1/completions", client, nil)
		if b := readAll(t, resp); resp.StatusCode != http.StatusOK || resp.Header.Get(node.HeaderNode) != "n1" {
			t.Fatalf("via n%d: status %d node %q: %s", i+1, resp.StatusCode, resp.Header.Get(node.HeaderNode), b)
		}
		if got := <-f.bodies; string(got) != want {
			t.Errorf("via n%d the engine got\n%s\nwant\n%s", i+1, got, want)
		}
	}
}

// TestResponsesOutputCapMeetsTheLimits: a Responses API max_output_tokens meets the limits a
// generation's max_tokens does: lowered to the route's limit in the body the engine gets with
// clamp_max_tokens, refused (400, naming max_output_tokens) past the model's context; a cap
// within them reaches the engine as sent.
func TestResponsesOutputCapMeetsTheLimits(t *testing.T) {
	eng := newRespEngine(t, "a")
	tn := startBehindPeer(t, eng.srv.URL, "openai", func(cfg *node.Config) {
		cfg.Admit.Budget.MaxMaxTokens, cfg.Admit.Budget.ClampMaxTokens = 200, true
	})
	const body = `{"model":"` + model + `","input":"hi","max_output_tokens":`
	for i, url := range tn.URLs() {
		for _, tc := range []struct{ sent, want string }{{"5000", "200"}, {"50", "50"}} {
			resp := post(t, url, "/v1/responses", body+tc.sent+`}`, nil)
			if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
				t.Fatalf("n%d, max_output_tokens %s: %d %s", i+1, tc.sent, resp.StatusCode, b)
			}
			if want := body + tc.want + `}`; eng.last() != want {
				t.Errorf("n%d, max_output_tokens %s: the engine got %s, want %s", i+1, tc.sent, eng.last(), want)
			}
		}
	}
	tn = startBehindPeer(t, eng.srv.URL, "openai", nil)
	resp := post(t, tn.URLs()[1], "/v1/responses", body+`1000000}`, nil)
	if e := decodeError(t, readAll(t, resp)); resp.StatusCode != http.StatusBadRequest || e.Error.Param == nil || *e.Error.Param != "max_output_tokens" {
		t.Errorf("max_output_tokens past the context: %d %+v", resp.StatusCode, e.Error)
	}
}
