package node_test

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/engine/sim"
)

// checkRefusal fails unless resp is a refusal of status and code whose param is param (""
// for null) and whose message holds every string of say and none of never.
func checkRefusal(t *testing.T, resp *http.Response, status int, code, param string, say []string, never ...string) {
	t.Helper()
	b := readAll(t, resp)
	e := decodeError(t, b)
	got := ""
	if e.Error.Param != nil {
		got = *e.Error.Param
	}
	if resp.StatusCode != status || e.Error.Code != code || got != param {
		t.Fatalf("status %d code %q param %q (%s), want %d %q %q", resp.StatusCode, e.Error.Code, got, e.Error.Message, status, code, param)
	}
	for _, s := range say {
		if !strings.Contains(e.Error.Message, s) {
			t.Errorf("message %q does not say %q", e.Error.Message, s)
		}
	}
	for _, s := range never {
		if strings.Contains(e.Error.Message, s) {
			t.Errorf("message %q says %q", e.Error.Message, s)
		}
	}
}

// TestRefusalsNameTheClientsField: a refusal names the field the client sent, not the one
// admission reads it as (max_completion_tokens, top_logprobs), and a prompt that leaves no
// room for output is refused as the prompt's, without a max_tokens the client never sent.
func TestRefusalsNameTheClientsField(t *testing.T) {
	url := startNet(t, 1, func(i int, cfg *node.Config) { cfg.MaxBodyBytes = 1 << 20 }).URLs()[0]
	msgs := `"messages":[{"role":"user","content":"x"}]`
	ctx := sim.DefaultConfig().Models[0].ContextTokens
	long := longPrompt("ctx", ctx+1000)
	tests := []struct {
		name, path, body, code, param string
		say                           []string
		never                         []string
	}{
		{"max_completion_tokens zero", "/v1/chat/completions", `{"model":"` + model + `",` + msgs + `,"max_completion_tokens":0}`,
			"invalid_parameter", "max_completion_tokens", []string{"max_completion_tokens must be at least 1"}, nil},
		{"max_tokens zero", "/v1/chat/completions", `{"model":"` + model + `",` + msgs + `,"max_tokens":0}`,
			"invalid_parameter", "max_tokens", []string{"max_tokens must be at least 1"}, nil},
		{"top_logprobs over 20", "/v1/chat/completions", `{"model":"` + model + `",` + msgs + `,"logprobs":true,"top_logprobs":21}`,
			"invalid_parameter", "top_logprobs", []string{"top_logprobs must be between 0 and 20"}, nil},
		{"completion logprobs over 20", "/v1/completions", `{"model":"` + model + `","prompt":"x","logprobs":21}`,
			"invalid_parameter", "logprobs", []string{"logprobs must be between 0 and 20"}, nil},
		{"chat prompt alone too long", "/v1/chat/completions", `{"model":"` + model + `","messages":[{"role":"user","content":"` + long + `"}]}`,
			"context_length_exceeded", "messages", []string{fmt.Sprintf("context is %d tokens", ctx), "no room"}, []string{"max_tokens"}},
		{"completion prompt alone too long", "/v1/completions", `{"model":"` + model + `","prompt":"` + long + `"}`,
			"context_length_exceeded", "prompt", []string{fmt.Sprintf("context is %d tokens", ctx)}, []string{"max_tokens"}},
		{"prompt too long with a cap", "/v1/chat/completions", `{"model":"` + model + `","messages":[{"role":"user","content":"` + long + `"}],"max_completion_tokens":5}`,
			"context_length_exceeded", "messages", []string{"max_completion_tokens 5"}, []string{"max_tokens"}},
		{"cap over the context", "/v1/chat/completions", `{"model":"` + model + `",` + msgs + `,"max_completion_tokens":` + fmt.Sprint(ctx) + `}`,
			"context_length_exceeded", "max_completion_tokens", []string{fmt.Sprintf("max_completion_tokens %d", ctx)}, []string{"max_tokens"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkRefusal(t, post(t, url, tt.path, tt.body, nil), http.StatusBadRequest, tt.code, tt.param, tt.say, tt.never...)
		})
	}
}

// TestNullKVTransferParamsIsAbsent: "kv_transfer_params": null is no connector parameter a
// client sets (null is the same as leaving a field out), so it is not refused.
func TestNullKVTransferParamsIsAbsent(t *testing.T) {
	url := startNet(t, 1, nil).URLs()[0]
	resp := post(t, url, "/v1/completions", `{"model":"`+model+`","prompt":"x","max_tokens":2,"kv_transfer_params":null}`, nil)
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	resp = post(t, url, "/v1/completions", `{"model":"`+model+`","prompt":"x","kv_transfer_params":null,"kv_transfer_params":{"do_remote_prefill":true}}`, nil)
	checkRefusal(t, resp, http.StatusBadRequest, "invalid_parameter", "kv_transfer_params", []string{"never by a client"})
}

// TestEncodedBodyIsRefused: a body with a Content-Encoding other than identity is 415
// unsupported_media_type naming the encoding, whether it is compressed (not a misleading
// "not a JSON object") or plain under a false name; identity is a plain body.
func TestEncodedBodyIsRefused(t *testing.T) {
	url := startNet(t, 1, nil).URLs()[0]
	body := `{"model":"` + model + `","prompt":"x","max_tokens":2}`
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(body))
	zw.Close()
	for _, tt := range []struct{ path, encoding, body string }{
		{"/v1/completions", "gzip", gz.String()},
		{"/v1/completions", "br", body},
		{"/v1/chat/completions", "identity, deflate", chatBody("x", 2, false)},
		{"/v1/embeddings", "zstd", `{"model":"` + model + `","input":"x"}`},
	} {
		t.Run(tt.path+" "+tt.encoding, func(t *testing.T) {
			resp := post(t, url, tt.path, tt.body, map[string]string{"Content-Encoding": tt.encoding})
			checkRefusal(t, resp, http.StatusUnsupportedMediaType, "unsupported_media_type", "Content-Encoding",
				[]string{strings.TrimPrefix(tt.encoding, "identity, ")})
		})
	}
	resp := post(t, url, "/v1/completions", body, map[string]string{"Content-Encoding": "Identity"})
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Errorf("identity: status %d: %s", resp.StatusCode, b)
	}
}

// TestExplainHeaderTakesTrue: X-Kvmesh-Explain asks for the candidates with 1 or true, in any
// case, as X-Kvmesh-Agent-Final does; 0, false or no header asks none.
func TestExplainHeaderTakesTrue(t *testing.T) {
	url := startNet(t, 1, nil).URLs()[0]
	for v, want := range map[string]bool{"1": true, "true": true, "TRUE": true, "True": true, "0": false, "false": false, "": false} {
		resp := post(t, url, "/v1/chat/completions", chatBody("x", 2, false), map[string]string{node.HeaderExplain: v})
		readAll(t, resp)
		if got := resp.Header.Get(node.HeaderExplain) != ""; resp.StatusCode != http.StatusOK || got != want {
			t.Errorf("%s: %q: status %d, explained %v, want %v", node.HeaderExplain, v, resp.StatusCode, got, want)
		}
	}
	resp := post(t, url, "/v1/chat/completions", chatBody("x", 2, false), map[string]string{node.HeaderAgent: "a", node.HeaderAgentFinal: "True"})
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Errorf("%s: True: status %d: %s", node.HeaderAgentFinal, resp.StatusCode, b)
	}
}
