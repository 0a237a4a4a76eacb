package node_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/node"
)

// reconciles checks the accounting identity on every node of urls: each request received is
// completed, refused or failed, once. Handlers of requests whose clients left may still be
// finishing, so it waits (bounded) for the counters to settle.
func reconciles(t *testing.T, urls []string) {
	t.Helper()
	for _, url := range urls {
		var received, done float64
		settled := poll.Within(10*time.Second, func() bool {
			received = metric(t, url, "kvmesh_requests_received_total", "")
			done = metric(t, url, "kvmesh_requests_completed_total", "") + metric(t, url, "kvmesh_requests_refused_total", "") +
				metric(t, url, "kvmesh_requests_failed_total", "")
			return received == done
		})
		if !settled {
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
	// The response declares the target it was held to: the normal class's 2 s plus its own
	// prefill; an explicit target is declared as sent.
	if got, err := time.ParseDuration(resp.Header.Get(node.HeaderTTFTTarget)); err != nil || got <= 2*time.Second {
		t.Errorf("fitted target %q (%v), want over the class's 2s", resp.Header.Get(node.HeaderTTFTTarget), err)
	}
	resp = post(t, urls[0], "/v1/chat/completions", chatBody("short", 8, false), map[string]string{node.HeaderTTFTSLO: "7s"})
	if readAll(t, resp); resp.Header.Get(node.HeaderTTFTTarget) != "7s" || resp.Header.Get(node.HeaderTPOTTarget) == "" {
		t.Errorf("explicit 7s target declared as %q (TPOT %q)", resp.Header.Get(node.HeaderTTFTTarget), resp.Header.Get(node.HeaderTPOTTarget))
	}
	reconciles(t, urls)
}

// TestKeyPriorityIsClamped pins who may ask for what: a batch key capped at low that asks for
// priority 1000 runs at low, and the response says so; a key allowed high gets high.
func TestKeyPriorityIsClamped(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "keys")
	file := admit.HashKey("sk-batch") + " batch 0 0 low\n" + admit.HashKey("sk-gold") + " gold 0 0 high\n" + scrapeKeyLine
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

// TestHighPriorityServedDuringASheddableFlood pins the scenario end to end: while a flood of
// 150 sheddable 4,500-token requests fills one node's waiting room, high-priority requests
// sent behind it are served. The waiting room's bands and the spare-capacity rule for
// sheddable work already kept this so before the engine scheduled by priority; the engine's
// order and the band-aware prediction are pinned by the sim's scheduler tests and
// admit/plan's TestOnlyTheWorkAheadOfTheBandCounts.
func TestHighPriorityServedDuringASheddableFlood(t *testing.T) {
	tn := startNet(t, 1, func(i int, cfg *node.Config) {
		cfg.Sim.KVBlocks = 8192
		cfg.Sim.TimeScale = 1
	})
	url := tn.URLs()[0]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for i := range 150 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions",
				strings.NewReader(chatBody(longPrompt(fmt.Sprint("flood ", i), 4500), 64, false)))
			req.Header.Set(node.HeaderPriority, "low")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		}()
	}
	poll.Until(t, 20*time.Second, "the flood queued", func() bool {
		return metric(t, url, "kvmesh_engine_requests_running", "") >= 4 && metric(t, url, "kvmesh_requests_received_total", "") >= 150
	})
	for i := range 5 {
		// A 5 s target rather than the class's 1 s: the engine runs in real time, and a loaded
		// machine must not turn its scheduling jitter into a refusal here.
		resp := post(t, url, "/v1/chat/completions", chatBody(longPrompt(fmt.Sprint("urgent ", i), 500), 16, false),
			map[string]string{node.HeaderPriority: "high", node.HeaderTTFTSLO: "5s"})
		if b := readAll(t, resp); resp.StatusCode != 200 {
			t.Errorf("high-priority request %d during the flood: %d %s", i, resp.StatusCode, b)
		}
	}
	cancel() // the flood's clients leave
	wg.Wait()
	poll.Until(t, 20*time.Second, "every request accounted", func() bool {
		received := metric(t, url, "kvmesh_requests_received_total", "")
		done := metric(t, url, "kvmesh_requests_completed_total", "") + metric(t, url, "kvmesh_requests_refused_total", "") +
			metric(t, url, "kvmesh_requests_failed_total", "")
		return received == 155 && done == received
	})
}

// TestKeyUsageReachesPeers pins the gossip half of a key's mesh-wide rate: what a rate-limited
// key consumed through one node appears, by its hash prefix, in that node's state record as
// its peers hold it, so they take it off their own share of the key's rate.
func TestKeyUsageReachesPeers(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte(admit.HashKey("sk-spread")+" spread 100000 100000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tn := startNet(t, 2, func(i int, cfg *node.Config) { cfg.APIKeysFile = keys })
	url := tn.URLs()[0]
	for range 3 {
		resp := post(t, url, "/v1/chat/completions", chatBody(longPrompt("spread", 1000), 8, false),
			map[string]string{"Authorization": "Bearer sk-spread"})
		if b := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
	}
	poll.Until(t, 10*time.Second, "n1's key usage in n2's view", func() bool {
		for _, m := range tn.Nodes[1].Members() {
			if m.Name == tn.Nodes[0].Name() {
				for _, u := range m.State.KeyUsage {
					if u.TokensPerSecond >= 1 {
						return true
					}
				}
			}
		}
		return false
	})
}
