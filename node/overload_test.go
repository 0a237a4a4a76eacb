package node_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/node"
)

func TestSLOUnattainableIsRefusedWithoutRunningThePrefill(t *testing.T) {
	simReg := prometheus.NewRegistry() // the engine's own counters, kept off the node's /metrics
	tn := startNet(t, 1, func(i int, cfg *node.Config) { cfg.Sim.Registerer = simReg })
	url := tn.URLs()[0]
	resp := post(t, url, "/v1/chat/completions", chatBody(longPrompt("slo", 3000), 4, false), map[string]string{node.HeaderTTFTSLO: "1ms"})
	b := readAll(t, resp)
	if resp.StatusCode != http.StatusTooManyRequests || decodeError(t, b).Error.Code != "slo_unattainable" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if got := sumGathered(t, []*prometheus.Registry{simReg}, "vllm:prompt_tokens_total"); got != 0 {
		t.Errorf("the engine prefilled %v tokens of a refused request", got)
	}
}

func TestKVBudgetRefusesWhatNoPoolCanHold(t *testing.T) {
	tn := startNet(t, 1, func(i int, cfg *node.Config) { cfg.Sim.KVBlocks = 64 }) // 1,024 tokens of KV
	url := tn.URLs()[0]
	resp := post(t, url, "/v1/chat/completions", chatBody(longPrompt("kv", 2000), 4, false), nil)
	if b := readAll(t, resp); resp.StatusCode != 400 || decodeError(t, b).Error.Code != "kv_budget" {
		t.Errorf("a request larger than every KV pool: status %d: %s", resp.StatusCode, b)
	}
	resp = post(t, url, "/v1/chat/completions", chatBody("hi", 4, false), map[string]string{node.HeaderPriority: "high"})
	if readAll(t, resp); resp.StatusCode != 200 {
		t.Errorf("a small request on the same node: status %d", resp.StatusCode)
	}
}

// fill starts n long requests in the background and returns once they hold over kvUse of the
// engine's KV blocks.
func fill(t *testing.T, url string, n, tokens, maxTokens int, kvUse float64) *sync.WaitGroup {
	t.Helper()
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			readAll(t, post(t, url, "/v1/chat/completions", chatBody(longPrompt(string(rune('a'+i)), tokens), maxTokens, false), map[string]string{node.HeaderPriority: "high"}))
		}()
	}
	poll.Until(t, 10*time.Second, "the engine to fill up", func() bool { return selfOf(peers(t, url)).KVUse > kvUse })
	return &wg
}

func TestQueuedRequestExpiresAtItsTTLWithoutEngineWork(t *testing.T) {
	tn := startNet(t, 1, func(i int, cfg *node.Config) {
		cfg.Sim.KVBlocks = 256 // 4,096 tokens
		cfg.Sim.TimeScale = 1
	})
	url := tn.URLs()[0]
	// 188 of 256 blocks held for about two seconds: the next request's 69 blocks do not fit.
	wg := fill(t, url, 1, 3000, 400, 0.7)
	served := metric(t, url, "kvmesh_engine_requests_total", "")
	start := time.Now()
	resp := post(t, url, "/v1/chat/completions", chatBody(longPrompt("late", 1000), 100, false), map[string]string{node.HeaderQueueTTL: "300ms"})
	b := readAll(t, resp)
	if resp.StatusCode != http.StatusTooManyRequests || decodeError(t, b).Error.Code != "queue_ttl_expired" {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if waited := time.Since(start); waited < 300*time.Millisecond {
		t.Errorf("refused after %v, before its 300ms TTL", waited)
	}
	if got := metric(t, url, "kvmesh_engine_requests_total", ""); got != served {
		t.Errorf("the engine took %v requests while the queued one waited; want none", got-served)
	}
	tn.Nodes[0].Shutdown(t.Context()) // stop the long requests rather than wait them out
	wg.Wait()
}

// Without kvmesh admission there is no waiting room: a request for a busy engine goes to the
// engine's own queue, as with a plain router, rather than waiting or being refused.
func TestNoAdmissionQueuesInTheEngine(t *testing.T) {
	tn := startNet(t, 1, func(i int, cfg *node.Config) {
		cfg.Admission = node.AdmissionNone
		cfg.Sim.KVBlocks = 256 // 4,096 tokens
		cfg.Sim.TimeScale = 2
	})
	url := tn.URLs()[0]
	// 188 of 256 blocks held: the next request's 69 blocks make the only peer busy.
	wg := fill(t, url, 1, 3000, 400, 0.7)
	served := metric(t, url, "kvmesh_engine_requests_total", "")
	resp := post(t, url, "/v1/chat/completions", chatBody(longPrompt("late", 1000), 100, false), map[string]string{node.HeaderQueueTTL: "300ms"})
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if got := metric(t, url, "kvmesh_engine_requests_total", ""); got != served+1 {
		t.Errorf("the engine took %v requests, want the one sent", got-served)
	}
	wg.Wait()
}

func TestHighPriorityIsServedWhileSheddableTrafficIsShed(t *testing.T) {
	tn := startNet(t, 1, func(i int, cfg *node.Config) {
		cfg.Sim.KVBlocks = 512
		cfg.Sim.TimeScale = 5
		cfg.Admit.Queue.MaxRequests = 8 // sheddable requests queue only while fewer than 4 wait
	})
	url := tn.URLs()[0]
	var mu sync.Mutex
	status := map[string]map[int]int{"high": {}, "low": {}}
	var wg sync.WaitGroup
	send := func(class string, i int) {
		defer wg.Done()
		resp := post(t, url, "/v1/chat/completions", chatBody(longPrompt(class+string(rune('a'+i)), 1000), 200, false), map[string]string{node.HeaderPriority: class})
		readAll(t, resp)
		mu.Lock()
		status[class][resp.StatusCode]++
		mu.Unlock()
	}
	for i := range 24 {
		wg.Add(1)
		go send("low", i)
	}
	for i := range 4 {
		wg.Add(1)
		go send("high", i)
	}
	wg.Wait()
	if status["high"][200] != 4 {
		t.Errorf("high priority: %v, want all 4 served", status["high"])
	}
	if status["low"][429] == 0 {
		t.Errorf("low priority: %v, want some shed with 429", status["low"])
	}
	if got := metric(t, url, "kvmesh_requests_refused_total", `code="queue_full"`); got != float64(status["low"][429]) {
		t.Errorf("queue_full refusals counted %v, low-priority 429s %d", got, status["low"][429])
	}
}

func TestNoCapacityWhenNoHealthyNodeServesTheModel(t *testing.T) {
	// The only node's engine is an external server that is not there: it never turns healthy.
	tn := startNet(t, 1, func(i int, cfg *node.Config) { cfg.Engine, cfg.Models = "http://127.0.0.1:1", []string{model} })
	url := tn.URLs()[0]
	resp := post(t, url, "/v1/chat/completions", chatBody("hi", 4, false), nil)
	b := readAll(t, resp)
	if resp.StatusCode != http.StatusServiceUnavailable || decodeError(t, b).Error.Code != "no_capacity" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("status %d Retry-After %q: %s", resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
	ready, err := http.Get(url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	if readAll(t, ready); ready.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/readyz with an unhealthy engine: %d", ready.StatusCode)
	}
}

// TestSmallRequestRunsBesideALongPromptWaitingForRoom pins backfill: a long prompt heading the
// waiting room holds the room it waits for on the node where it fits first, and a short
// request queued behind it runs now on the other node's free KV instead of waiting for the
// long prompt (here, for the long requests filling both nodes to end).
func TestSmallRequestRunsBesideALongPromptWaitingForRoom(t *testing.T) {
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		cfg.Sim.KVBlocks = 256 // 4,096 tokens
		cfg.Sim.TimeScale = 0.5
	})
	urls := tn.URLs()
	in := urls[0]
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	long := func(seed string, prompt, maxTokens int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, in+"/v1/chat/completions",
				strings.NewReader(chatBody(longPrompt(seed, prompt), maxTokens, true)))
			if err != nil {
				return
			}
			req.Header.Set(node.HeaderTTFTSLO, "1m")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		}()
	}
	kv := func(i int) float64 { return metric(t, urls[i], "kvmesh_engine_kv_use_ratio", "") }
	// 175 blocks on one node; the next 100 cannot join them, so they go to the other.
	long("x", 2800, 1000)
	poll.Until(t, 10*time.Second, "the first node to fill", func() bool { return max(kv(0), kv(1)) > 0.6 })
	long("y", 1600, 1000)
	poll.Until(t, 10*time.Second, "the second node to fill", func() bool { return min(kv(0), kv(1)) > 0.35 })
	// 150 blocks or more fit on neither node: the long prompt waits, holding the second node.
	long("big", 2400, 100)
	poll.Until(t, 10*time.Second, "the long prompt queued", func() bool {
		return metric(t, in, "kvmesh_admission_queued_total", "") == 1
	})
	resp := post(t, in, "/v1/chat/completions", chatBody("a short question", 20, false),
		map[string]string{node.HeaderTTFTSLO: "1m", node.HeaderQueueTTL: "5s"})
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("the short request behind the long prompt: status %d: %s", resp.StatusCode, b)
	}
	if got := metric(t, in, "kvmesh_admission_backfilled_total", ""); got != 1 {
		t.Errorf("kvmesh_admission_backfilled_total = %v, want 1", got)
	}
	if got := metric(t, in, "kvmesh_requests_completed_total", ""); got != 1 {
		t.Errorf("%v requests completed, want only the short one: it ran beside the long ones", got)
	}
}
