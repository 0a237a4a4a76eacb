package node_test

import (
	"bufio"
	"net/http"
	"testing"

	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet"
)

// TestEngineDeathMidDecodeMigrates pins that the engine of a decode node that decodes a split
// request's handover itself (it is the ingress) dying mid-stream does not lose the request:
// the client, who read some of the stream, still reads it to one finish_reason, the whole
// request's usage and [DONE], without an error event, and the ingress counts one engine
// migration completed.
func TestEngineDeathMidDecodeMigrates(t *testing.T) {
	tn := startNet(t, 3, roles("prefill", "decode", "decode"))
	urls := tn.URLs()
	const maxTokens = 200
	var resp *http.Response
	ingress := -1
	for i := 1; i <= 2 && ingress < 0; i++ {
		resp = post(t, urls[i], "/v1/chat/completions", chatBody(longPrompt("decode death", 2000), maxTokens, true), nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("n%d: status %d: %s", i+1, resp.StatusCode, readAll(t, resp))
		}
		if resp.Header.Get(node.HeaderNode) == testnet.Name(i) && resp.Header.Get(node.HeaderPrefillNode) == "n1" {
			ingress = i
			break
		}
		t.Logf("n%d: decoded on %q after a prefill on %q; trying the other decode node", i+1,
			resp.Header.Get(node.HeaderNode), resp.Header.Get(node.HeaderPrefillNode))
		readAll(t, resp)
	}
	if ingress < 0 {
		t.Fatal("no decode node decoded its own request")
	}
	r := &sseReader{t: t, br: bufio.NewReader(resp.Body)}
	var got stream
	got.readText(t, r, 5)
	if err := tn.Nodes[ingress].KillEngine(); err != nil {
		t.Fatal(err)
	}
	got.readRest(r)
	resp.Body.Close()
	if got.last != "[DONE]" || len(got.finishes) != 1 || got.roles != 1 {
		t.Errorf("stream ended with %q, finish reasons %q, %d role chunks; want [DONE], one finish, one role chunk",
			got.last, got.finishes, got.roles)
	}
	if got.usage == nil || got.usage.CompletionTokens != maxTokens {
		t.Errorf("usage %+v, want %d completion tokens", got.usage, maxTokens)
	}
	if n := metric(t, urls[ingress], "kvmesh_migrations_total", `cause="engine",outcome="completed"`); n != 1 {
		t.Errorf("engine migrations completed = %v, want 1", n)
	}
}
