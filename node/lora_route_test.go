package node_test

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/node"
)

// prefixRe reads a candidate's cached prompt tokens from the explain header.
var prefixRe = regexp.MustCompile(` prefix=(\d+)`)

// explainFor sends a chat request for model with content through url, asking for the explain
// header, and returns it.
func explainFor(t *testing.T, url, model, content string) string {
	t.Helper()
	resp := post(t, url, "/v1/chat/completions", chatFor(model, content), map[string]string{node.HeaderExplain: "1"})
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("request for %s: status %d: %s", model, resp.StatusCode, body)
	}
	return resp.Header.Get(node.HeaderExplain)
}

// cachedAnywhere reports whether some candidate of an explain header holds a cached prefix.
func cachedAnywhere(explain string) bool {
	for _, m := range prefixRe.FindAllStringSubmatch(explain, -1) {
		if m[1] != "0" {
			return true
		}
	}
	return false
}

// The KV prefix of an adapter's request is the adapter's: once adapter a's prompt is cached,
// a request for a with it finds it, while the base model's and adapter b's requests with the
// same prompt count none of a's blocks. The explain header names each candidate's adapter
// residency, and the routing decision counts it.
func TestAdapterPrefixIsTheAdapters(t *testing.T) {
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		cfg.Sim.LoRAModules = map[string]string{"a": "/lora/a", "b": "/lora/b"}
	})
	url := tn.URLs()[0]
	prompt := strings.Repeat("the adapter's own system prompt, long enough for many blocks. ", 40)
	poll.Until(t, 10*time.Second, "adapter a's prompt to be cached", func() bool {
		return cachedAnywhere(explainFor(t, url, "a", prompt))
	})
	if e := explainFor(t, url, "a", prompt); !strings.Contains(e, " lora=resident") {
		t.Errorf("explain %q of a request for resident adapter a names no lora=resident", e)
	}
	for _, model := range []string{node.DefaultModel, "b"} {
		if e := explainFor(t, url, model, prompt); cachedAnywhere(e) {
			t.Errorf("a request for %s counts adapter a's cached blocks: %s", model, e)
		}
	}
	if e := explainFor(t, url, node.DefaultModel, prompt+"x"); strings.Contains(e, "lora=") {
		t.Errorf("explain %q of a base model's request names an adapter residency", e)
	}
	if n := metric(t, url, "kvmesh_route_adapter_requests_total", ""); n < 1 {
		t.Errorf("kvmesh_route_adapter_requests_total = %v after adapter requests, want ≥ 1", n)
	}
}
