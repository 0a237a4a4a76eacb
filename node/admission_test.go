package node_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/node"
)

// reconciles checks the accounting identity on every node of urls: each request received is
// completed, refused or failed, once.
func reconciles(t *testing.T, urls []string) {
	t.Helper()
	for _, url := range urls {
		received := metric(t, url, "kvmesh_requests_received_total", "")
		done := metric(t, url, "kvmesh_requests_completed_total", "") + metric(t, url, "kvmesh_requests_refused_total", "") +
			metric(t, url, "kvmesh_requests_failed_total", "")
		if received != done {
			t.Errorf("%s: received %v, completed+refused+failed %v", url, received, done)
		}
	}
}

// TestIdleMeshServesALongPrompt pins "refused for contention, never for size": on an idle
// 3-node mesh, a normal request whose 100k-token prompt no engine can prefill within the
// class's 2 s TTFT target is served, because a request that names no SLO gets a target that
// grows with its own prefill; the same prompt with an explicit target no engine can meet is
// refused slo_unattainable, its hard meaning kept.
func TestIdleMeshServesALongPrompt(t *testing.T) {
	tn := startNet(t, 3, func(i int, cfg *node.Config) {
		cfg.Sim.KVBlocks = 8192 // 131k tokens: the prompt fits the pool
		cfg.Sim.TimeScale = 1   // real time: 100k tokens take about 3 s to prefill
	})
	urls := tn.URLs()
	// The class's target alone, asked for explicitly, is one no engine can meet.
	resp := post(t, urls[2], "/v1/chat/completions", chatBody(longPrompt("hard", 100_000), 8, false),
		map[string]string{node.HeaderTTFTSLO: "2s"})
	b := readAll(t, resp)
	if resp.StatusCode != 429 || decodeError(t, b).Error.Code != admit.CodeSLOUnattainable {
		t.Fatalf("with an explicit 2s target: %d %s, want 429 slo_unattainable", resp.StatusCode, b)
	}
	resp = post(t, urls[1], "/v1/chat/completions", chatBody(longPrompt("soft", 100_000), 8, false), nil)
	if b := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("100k-token prompt on an idle mesh: %d %s", resp.StatusCode, b)
	}
	reconciles(t, urls)
}

// TestKeyPriorityIsClamped pins who may ask for what: a batch key capped at low that asks for
// priority 1000 runs at low, and the response says so; a key allowed high gets high.
func TestKeyPriorityIsClamped(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "keys")
	file := admit.HashKey("sk-batch") + " batch 0 0 low\n" + admit.HashKey("sk-gold") + " gold 0 0 high\n"
	if err := os.WriteFile(keys, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	tn := startNet(t, 1, func(i int, cfg *node.Config) { cfg.APIKeysFile = keys })
	url := tn.URLs()[0]
	ask := func(key, prio string) (int, string) {
		resp := post(t, url, "/v1/chat/completions", chatBody("clamp", 4, false),
			map[string]string{"Authorization": "Bearer " + key, node.HeaderPriority: prio})
		readAll(t, resp)
		return resp.StatusCode, resp.Header.Get(node.HeaderPriorityGranted)
	}
	if status, granted := ask("sk-batch", "1000"); status != 200 || granted != "-10" {
		t.Errorf("batch key asking 1000: status %d, granted %q, want 200 and -10", status, granted)
	}
	if status, granted := ask("sk-gold", "high"); status != 200 || granted != "" {
		t.Errorf("gold key asking high: status %d, granted %q, want 200 and no clamp", status, granted)
	}
	if got := metric(t, url, "kvmesh_requests_received_total", ""); got != 2 {
		t.Errorf("received %v requests, want 2", got)
	}
	reconciles(t, []string{url})
}
