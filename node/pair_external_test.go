package node_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet"
)

// TestExternalSplitRequestStreams pins a request split across nodes in front of external
// engines, kvmesh engines in the prefill and decode roles as vLLM servers with a KV connector
// would be: from every ingress, streamed and not, the client reads the text a mixed node
// writes for the same request, one role chunk and the whole request's usage; the prefill
// engine's kv_transfer_params are the handover, which never reaches the client.
func TestExternalSplitRequestStreams(t *testing.T) {
	tn := startNet(t, 3, roles("prefill", "decode", "decode"), testnet.EnginesExternal)
	splitStreams(t, tn)
	// The prefill node ran every prefill: 3 ingresses, 2 requests each.
	if got := metric(t, tn.URLs()[0], "kvmesh_engine_requests_total", ""); got != 6 {
		t.Errorf("the prefill node ran %v halves, want 6", got)
	}
}

// TestExternalPrefillEngineDown pins a prefill node whose engine is gone: the prefill is
// retried on the other prefill node, and with neither engine left the request ends with an
// explicit 502, not a hang.
func TestExternalPrefillEngineDown(t *testing.T) {
	tn := startNet(t, 3, roles("decode", "prefill", "prefill"), testnet.EnginesExternal)
	prefillDies(t, tn, func(i int) error { return tn.Engines[i].Shutdown(context.Background()) }, "engine_error")
}

// TestExternalPrefillAnswersGarbage pins a prefill server whose answer is unusable: one that
// is not JSON, or has no kv_transfer_params, fails the prefill (502 engine_error); one whose
// kv_transfer_params name a handover nobody holds fails the decode, whose engine refuses it
// (502 decode_failed: the prefill node is the ingress, so the decode is forwarded), never the
// client's 400.
func TestExternalPrefillAnswersGarbage(t *testing.T) {
	var answer atomic.Pointer[string]
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","max_model_len":8192}]}`, model)
		case "/metrics":
			io.WriteString(w, "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")
		default:
			io.WriteString(w, *answer.Load())
		}
	}))
	t.Cleanup(fake.Close)
	decoder := startEngine(t, roleEngine("decode"))
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		roles("prefill", "decode")(i, cfg)
		cfg.Engine, cfg.EngineKind, cfg.Models = fake.URL, "vllm", nil
		if i == 1 {
			cfg.Engine = decoder
		}
	})
	host := strings.TrimPrefix(decoder, "http://")
	h, port, _ := strings.Cut(host, ":")
	tests := []struct {
		name, answer, code string
	}{
		{"not JSON", "<html>oops</html>", "engine_error"},
		{"no connector", `{"choices":[],"kv_transfer_params":null}`, "engine_error"},
		{"unknown handover", `{"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"x","remote_request_id":"nothing",` +
			`"remote_block_ids":[],"remote_host":"` + h + `","remote_port":` + port + `}}`, node.CodeDecodeFailed},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			answer.Store(&tt.answer)
			resp := post(t, tn.URLs()[0], "/v1/chat/completions", chatBody(longPrompt(tt.name, 800), 16, true), nil)
			b := readAll(t, resp)
			if e := decodeError(t, b).Error; resp.StatusCode != http.StatusBadGateway || e.Code != tt.code {
				t.Errorf("%d %s, want 502 %s", resp.StatusCode, b, tt.code)
			}
			assertReconciled(t, tn.URLs()[0], float64(i+1))
		})
	}
}
