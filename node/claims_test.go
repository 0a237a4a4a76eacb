package node_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/node"
)

// TestClaimHoldsRoomAcrossIngresses pins KV claims: a long prompt on its default TTFT target
// waiting at one ingress for KV room claims the room on the node where it fits first, and the other nodes keep their
// requests off it, as ingresses and as the claimed node itself, until the long prompt runs
// there; then they use the room again.
func TestClaimHoldsRoomAcrossIngresses(t *testing.T) {
	tn := startNet(t, 3, func(i int, cfg *node.Config) {
		cfg.Sim.KVBlocks = 1000
		// The long prompt claims on its default target (an explicit one does not claim);
		// a minute of it keeps the test's pace out of its way.
		cfg.Admit.SLO.Normal.TTFT = admit.Duration(time.Minute)
	})
	urls := tn.URLs()
	a, x, b := tn.Nodes[0], tn.Nodes[1], tn.Nodes[2] // n1, n2, n3
	a.HoldKV(1000, true)
	b.HoldKV(1000, true)
	x.HoldKV(600, true)
	until(t, "every record to show the held KV", func() bool {
		return a.PeerKVUsed("n2") >= 600 && b.PeerKVUsed("n2") >= 600 && a.PeerKVUsed("n3") >= 1000 && b.PeerKVUsed("n1") >= 1000
	})

	// 8,000 tokens, 500 blocks: not in the 350 blocks n2 has under its admission mark.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	long := make(chan int, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, urls[0]+"/v1/chat/completions",
			strings.NewReader(chatBody(longPrompt("claim", 8000), 8, false)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			long <- 0
			return
		}
		readAll(t, resp)
		long <- resp.StatusCode
	}()
	until(t, "n3 and n2 to see n1's claim on n2", func() bool { return b.ClaimedOn("n2") >= 500 && x.ClaimedOn("n2") >= 500 })

	// 350 blocks would take a short request at n3 or at n2 itself; the claim leaves none.
	short := func(url, ttl string) (int, string) {
		resp := post(t, url, "/v1/chat/completions", chatBody("a short question", 4, false),
			map[string]string{node.HeaderTTFTSLO: "1m", node.HeaderQueueTTL: ttl})
		body := readAll(t, resp)
		if resp.StatusCode == http.StatusOK {
			return resp.StatusCode, ""
		}
		return resp.StatusCode, decodeError(t, body).Error.Code
	}
	for _, url := range []string{urls[1], urls[2]} {
		if code, why := short(url, "300ms"); code != http.StatusTooManyRequests || why != "queue_ttl_expired" {
			t.Errorf("%s: a short request while n2's room is claimed: %d %s, want 429 queue_ttl_expired", url, code, why)
		}
	}

	x.HoldKV(0, true)
	if code := <-long; code != http.StatusOK {
		t.Fatalf("the long prompt: %d, want 200 once n2 has room", code)
	}
	// n2 took it at once: its own claim, which n2 may still hold, is not in its way.
	if got := metric(t, urls[0], "kvmesh_forward_attempts_total", `result="refused"`); got != 0 {
		t.Errorf("n2 refused the long prompt %v times, want 0", got)
	}
	until(t, "the claim to clear", func() bool { return b.ClaimedOn("n2") == 0 })
	if code, why := short(urls[2], "5s"); code != http.StatusOK {
		t.Errorf("a short request at n3 after the claim cleared: %d %s, want 200", code, why)
	}
	assertReconciled(t, urls[0], 1)
	assertReconciled(t, urls[1], 1)
	assertReconciled(t, urls[2], 2)
}
