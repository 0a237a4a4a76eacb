package node_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/openai"
)

// roleEngine sets a kvmesh engine's role.
func roleEngine(role string) func(*node.Config) {
	return func(cfg *node.Config) { cfg.Name, cfg.Sim.Role = "engine-"+role, role }
}

// withParams is body with kv_transfer_params set to params (raw JSON).
func withParams(t *testing.T, body, params string) string {
	t.Helper()
	out, err := openai.SetMember([]byte(body), "kv_transfer_params", func([]byte) []byte { return []byte(params) })
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// TestEngineRolesSpeakVLLMTransfer pins kvmesh engine in the prefill and decode roles as
// vLLM's proxy drives a prefill and a decode server: the prefill engine answers a
// do_remote_decode request with no text and kv_transfer_params naming the handover it holds;
// the decode engine, given the original request with those params, pulls the KV and streams
// the text a mixed engine gives for the request, with the whole request's usage; given the
// request without params, it runs it whole, as vLLM's decode server does. Each half refuses
// what it does not run, and bad or unknown params are a 400 that says what is wrong.
func TestEngineRolesSpeakVLLMTransfer(t *testing.T) {
	pre, dec, mixed := startEngine(t, roleEngine("prefill")), startEngine(t, roleEngine("decode")), startEngine(t)
	prompt := longPrompt("engine-roles", 600)
	streamBody := chatBody(prompt, 40, true)
	resp := post(t, mixed, "/v1/chat/completions", streamBody, nil)
	want := readStream(t, readAll(t, resp))

	prefillBody := withParams(t, chatBody(prompt, 1, false), openai.PrefillTransferParams)
	resp = post(t, pre, "/v1/chat/completions", prefillBody, nil)
	b := readAll(t, resp)
	var ans struct {
		whole
		Params openai.KVTransferParams `json:"kv_transfer_params"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &ans) != nil {
		t.Fatalf("prefill: %d %s", resp.StatusCode, b)
	}
	kt := ans.Params
	if !kt.DoRemotePrefill || kt.DoRemoteDecode || kt.RemoteEngineID == nil || kt.RemoteRequestID == "" ||
		kt.RemoteHost == nil || kt.RemotePort == nil || len(kt.RemoteBlockIDs) != want.usage.PromptTokens/16 {
		t.Fatalf("prefill answered kv_transfer_params %s", b)
	}
	if len(ans.Choices) != 1 || ans.Choices[0].Message.Content != "" || ans.Choices[0].FinishReason != "length" ||
		ans.Usage.PromptTokens != want.usage.PromptTokens {
		t.Errorf("prefill answer %s", b)
	}
	params, _ := json.Marshal(kt)

	for i := range 2 { // a handover may be pulled again (a retried decode)
		resp = post(t, dec, "/v1/chat/completions", withParams(t, streamBody, string(params)), nil)
		b = readAll(t, resp)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("decode %d: %d %s", i, resp.StatusCode, b)
		}
		got := readStream(t, b)
		if got.text != want.text || got.usage.PromptTokens != want.usage.PromptTokens ||
			got.usage.CompletionTokens != want.usage.CompletionTokens || !got.done {
			t.Errorf("decode %d: %q %+v, want %q %+v", i, got.text, got.usage, want.text, want.usage)
		}
	}
	resp = post(t, dec, "/v1/chat/completions", streamBody, nil)
	if b = readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("a whole request on the decode engine: %d %s", resp.StatusCode, b)
	}
	if got := readStream(t, b); got.text != want.text || got.usage.CompletionTokens != want.usage.CompletionTokens || !got.done {
		t.Errorf("a whole request on the decode engine: %q %+v, want %q %+v", got.text, got.usage, want.text, want.usage)
	}

	edit := func(f func(p *openai.KVTransferParams)) string {
		p := kt
		f(&p)
		b, _ := json.Marshal(p)
		return string(b)
	}
	other := "nobody"
	refused := []struct {
		name, url, body, code, says string
	}{
		{"a whole request on a prefill engine", pre, streamBody, openai.CodeInvalidRequest, "prefills only"},
		{"a prefill streamed", pre, withParams(t, streamBody, openai.PrefillTransferParams), openai.CodeInvalidParameter, "stream false"},
		{"a prefill on a decode engine", dec, prefillBody, openai.CodeInvalidRequest, "does not prefill"},
		{"a handover on a prefill engine", pre, withParams(t, chatBody(prompt, 40, false), string(params)), openai.CodeInvalidRequest, "does not decode"},
		{"params not an object", dec, withParams(t, streamBody, `[1]`), openai.CodeInvalidParameter, "must be an object"},
		{"no remote", dec, withParams(t, streamBody, `{"do_remote_prefill":true}`), openai.CodeInvalidParameter, "remote_engine_id"},
		{"unknown handover", dec, withParams(t, streamBody, edit(func(p *openai.KVTransferParams) { p.RemoteRequestID = "feed" })),
			openai.CodeInvalidParameter, `no handover "feed"`},
		{"another engine's id", dec, withParams(t, streamBody, edit(func(p *openai.KVTransferParams) { p.RemoteEngineID = &other })),
			openai.CodeInvalidParameter, "is not the engine at"},
		{"block count", dec, withParams(t, streamBody, edit(func(p *openai.KVTransferParams) { p.RemoteBlockIDs = p.RemoteBlockIDs[1:] })),
			openai.CodeInvalidParameter, "remote_block_ids"},
		{"another prompt", dec, withParams(t, chatBody(longPrompt("other", 600), 40, true), string(params)),
			openai.CodeInvalidParameter, "another prompt"},
	}
	for _, tt := range refused {
		resp := post(t, tt.url, "/v1/chat/completions", tt.body, nil)
		b := readAll(t, resp)
		if e := decodeError(t, b).Error; resp.StatusCode != http.StatusBadRequest || e.Code != tt.code || !strings.Contains(e.Message, tt.says) {
			t.Errorf("%s: %d %s, want 400 %s saying %q", tt.name, resp.StatusCode, b, tt.code, tt.says)
		}
	}

	// The prefill engine gone: the decode engine cannot pull, which is its failure (502).
	port := 1 // nothing listens on loopback's port 1
	resp = post(t, dec, "/v1/chat/completions", withParams(t, streamBody, edit(func(p *openai.KVTransferParams) { p.RemotePort = &port })), nil)
	if b := readAll(t, resp); resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(b), "cannot pull") {
		t.Errorf("prefill engine unreachable: %d %s, want 502 saying it cannot pull", resp.StatusCode, b)
	}
}
