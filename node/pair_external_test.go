package node_test

import (
	"context"
	"encoding/json"
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
	prompt := longPrompt("external split", 600)
	streamBody, wholeBody := chatBody(prompt, 40, true), chatBody(prompt, 40, false)
	ref := mixedAnswers(t, streamBody, wholeBody)
	want := readStream(t, []byte(ref[0]))
	var wantWhole whole
	if err := json.Unmarshal([]byte(ref[1]), &wantWhole); err != nil {
		t.Fatal(err)
	}

	tn := startNet(t, 3, roles("prefill", "decode", "decode"), testnet.EnginesExternal)
	for i, url := range tn.URLs() {
		resp := post(t, url, "/v1/chat/completions", streamBody, nil)
		b := readAll(t, resp)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("n%d: %d %s", i+1, resp.StatusCode, b)
		}
		got := readStream(t, b)
		if got.text != want.text || got.roles != 1 || len(got.finish) != 1 || !got.done || got.errored ||
			got.usage.PromptTokens != want.usage.PromptTokens || got.usage.CompletionTokens != want.usage.CompletionTokens {
			t.Errorf("n%d: text %q, %d role chunks, finish %v, usage %+v; want %q, one role chunk, usage %+v",
				i+1, got.text, got.roles, got.finish, got.usage, want.text, want.usage)
		}
		if strings.Contains(string(b), "kv_transfer_params") {
			t.Errorf("n%d: the client read the handover: %s", i+1, b)
		}

		resp = post(t, url, "/v1/chat/completions", wholeBody, nil)
		b = readAll(t, resp)
		var w whole
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &w) != nil || len(w.Choices) != 1 {
			t.Fatalf("n%d not streamed: %d %s", i+1, resp.StatusCode, b)
		}
		if w.Choices[0].Message.Content != wantWhole.Choices[0].Message.Content ||
			w.Usage.PromptTokens != wantWhole.Usage.PromptTokens || w.Usage.CompletionTokens != wantWhole.Usage.CompletionTokens {
			t.Errorf("n%d not streamed: %s, want %s", i+1, b, ref[1])
		}
		if got := metric(t, url, "kvmesh_route_disaggregated_total", `outcome="handover"`); got != 2 {
			t.Errorf("n%d: handover = %v, want 2", i+1, got)
		}
		assertReconciled(t, url, 2)
	}
	// Every prefill ran on the prefill node's engine, every decode on a decode node's.
	if got := metric(t, tn.URLs()[0], "kvmesh_engine_requests_total", ""); got != 6 {
		t.Errorf("the prefill node ran %v halves, want 6", got)
	}
}

// TestExternalPrefillEngineDown pins a prefill node whose engine is gone: the prefill is
// retried on the other prefill node, and with neither engine left the request ends with an
// explicit 502, not a hang.
func TestExternalPrefillEngineDown(t *testing.T) {
	tn := startNet(t, 3, roles("decode", "prefill", "prefill"), testnet.EnginesExternal)
	url := tn.URLs()[0] // the decode node is the ingress: both prefill nodes are peers
	body := chatBody(longPrompt("engine down", 800), 16, true)
	resp := post(t, url, "/v1/chat/completions", body, nil)
	first := readAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, first)
	}
	// Stop the engine of the prefill node that holds the prompt's prefix: the next request
	// prefers that node.
	served, other := 1, 2
	if metric(t, tn.URLs()[2], "kvmesh_engine_requests_total", `origin="peer"`) > 0 {
		served, other = 2, 1
	}
	if err := tn.Engines[served].Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	resp = post(t, url, "/v1/chat/completions", body, nil)
	b := readAll(t, resp)
	if resp.StatusCode != http.StatusOK || readStream(t, b).text != readStream(t, first).text {
		t.Fatalf("after the prefill engine stopped: %d %s", resp.StatusCode, b)
	}
	if got := metric(t, url, "kvmesh_route_disaggregated_total", `outcome="prefill_retried"`); got != 1 {
		t.Errorf("prefill_retried = %v, want 1", got)
	}
	if got := metric(t, tn.URLs()[other], "kvmesh_engine_requests_total", `origin="peer"`); got != 1 {
		t.Errorf("the other prefill node ran %v prefills, want 1", got)
	}

	if err := tn.Engines[other].Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	resp = post(t, url, "/v1/chat/completions", chatBody(longPrompt("none left", 800), 16, true), map[string]string{node.HeaderQueueTTL: "20s"})
	b = readAll(t, resp)
	if e := decodeError(t, b).Error; resp.StatusCode != http.StatusBadGateway || e.Code != "engine_error" {
		t.Fatalf("%d %s, want 502 engine_error", resp.StatusCode, b)
	}
	assertReconciled(t, url, 3)
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
