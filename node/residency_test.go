package node_test

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node"
)

// startKVEngine serves a fast simulated engine alone (kvmesh engine) with one model and a KV
// cache of kvBlocks 16-token blocks, as an external engine for a node.
func startKVEngine(t *testing.T, model string, kvBlocks int) string {
	t.Helper()
	return "http://" + startEngineNode(t, model, kvBlocks, nil).HTTPAddr()
}

// startEngineNode is startKVEngine's engine, its config changed by mod (if not nil).
func startEngineNode(t *testing.T, model string, kvBlocks int, mod func(*node.Config)) *node.Node {
	t.Helper()
	cfg := node.DefaultConfig()
	cfg.Name, cfg.HTTPAddr, cfg.Standalone, cfg.GPU = "engine-"+model, "127.0.0.1:0", true, "none"
	cfg.Models = []string{model}
	cfg.Sim.TimeScale = 100
	cfg.Sim.KVBlocks = kvBlocks
	if mod != nil {
		mod(&cfg)
	}
	n, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Shutdown(context.Background()) })
	return n
}

// chatFor is a streamed chat request for model with one user message, asking for usage.
func chatFor(model, content string) string {
	b, _ := json.Marshal(map[string]any{
		"model":          model,
		"messages":       []map[string]string{{"role": "user", "content": content}},
		"max_tokens":     4,
		"stream":         true,
		"stream_options": map[string]bool{"include_usage": true},
	})
	return string(b)
}

// TestExternalEngineResidencyReachesPeers: a node in front of an external engine tells the
// mesh what that engine caches. Two nodes, each in front of its own kvmesh engine (64 blocks of
// KV, one model each, so where a request runs is fixed, and a model both serve, which puts
// them in one prefix domain); prompts go in through node B and run on node A's engine. B's
// own speculative entries expire at once, so what B knows of A's
// prefixes came through gossip from A's residency model: first a long prompt, then its
// eviction once other prompts filled the engine. Last, the engine's own report of that prompt
// is compared with what the mesh believed.
func TestExternalEngineResidencyReachesPeers(t *testing.T) {
	const modelA, modelB = "model-a", "model-b"
	shared := func(c *node.Config) { c.Models = append(c.Models, "model-shared") }
	engines := []string{"http://" + startEngineNode(t, modelA, 64, shared).HTTPAddr(), "http://" + startEngineNode(t, modelB, 64, shared).HTTPAddr()}
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		cfg.Engine, cfg.Models = engines[i], nil // the engine's own model list
		cfg.SpeculativeTTL = time.Nanosecond
	})
	a, b := tn.Nodes[0], tn.Nodes[1]
	urlA, urlB := tn.URLs()[0], tn.URLs()[1]

	send := func(content string) usage {
		t.Helper()
		resp := post(t, urlB, "/v1/chat/completions", chatFor(modelA, content), nil)
		body := readAll(t, resp)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(node.HeaderNode) != a.Name() {
			t.Fatalf("status %d on %q: %s", resp.StatusCode, resp.Header.Get(node.HeaderNode), body)
		}
		return streamUsage(t, sseEvents(t, body))
	}
	blocksOf := func(content string) []uint64 {
		prompt := kvindex.RenderChat(nil, []kvindex.Message{{Role: "user", Content: content}})
		return kvindex.AppendBlocks(nil, modelA, prompt, kvindex.DefaultBlockTokens)
	}
	peerBlocks := func() int {
		for _, p := range peers(t, urlB).Peers {
			if p.Name == a.Name() {
				return p.PrefixBlocks
			}
		}
		return -1
	}

	// 626 tokens: 39 full blocks and 2 tokens.
	long := longPrompt("long", 620)
	lb := blocksOf(long)
	if u := send(long); u.PromptTokensDetails.CachedTokens != 0 || len(lb) != 39 {
		t.Fatalf("first long prompt: %+v, %d blocks", u, len(lb))
	}
	poll.Until(t, 10*time.Second, "B to learn A's long prefix by gossip", func() bool {
		return b.PrefixOf(a.Name(), lb) == kvindex.AnchoredLen(len(lb)) && peerBlocks() == anchorsIn(len(lb))
	})

	// Two prompts of 29 blocks each overflow the 64-block engine: the long prompt, least
	// recently used, loses its tail.
	for _, seed := range []string{"fill-1", "fill-2"} {
		send(longPrompt(seed, 460))
	}
	var believed int
	poll.Until(t, 10*time.Second, "B to learn the eviction by gossip", func() bool {
		believed = b.PrefixOf(a.Name(), lb)
		return believed < kvindex.AnchoredLen(len(lb)) && believed == a.PrefixOf(a.Name(), lb) && peerBlocks() <= 64
	})
	t.Logf("after the fill, the mesh believes A's engine holds %d of the long prompt's %d blocks", believed, len(lb))

	// What the engine itself had: the prompt's cached tokens when it runs again, matched by
	// anchors as the mesh matches.
	u := send(long)
	bt := kvindex.DefaultBlockTokens
	predicted, reported := believed*bt, kvindex.AnchoredLen(u.PromptTokensDetails.CachedTokens/bt)*bt
	t.Logf("long prompt again: predicted %d cached tokens, engine reported %d (anchored %d) of %d (error %.3f)",
		predicted, u.PromptTokensDetails.CachedTokens, reported, u.PromptTokens, math.Abs(float64(predicted-reported))/float64(u.PromptTokens))
	if predicted != reported {
		t.Errorf("the mesh believed %d tokens of the prompt cached, the engine had %d anchored", predicted, reported)
	}
	n, sum := metric(t, urlA, "kvmesh_residency_error_ratio_count", ""), metric(t, urlA, "kvmesh_residency_error_ratio_sum", "")
	t.Logf("A's residency model over %v requests: mean error ratio %.4f; predicted %v, reported %v cached tokens", n, sum/n,
		metric(t, urlA, "kvmesh_residency_predicted_cached_tokens_total", ""), metric(t, urlA, "kvmesh_residency_reported_cached_tokens_total", ""))
	if n != 4 {
		t.Errorf("%v requests judged, want 4", n)
	}
	if q := selfOf(peers(t, urlA)).QueuedPrefillTokens; q != 0 {
		t.Errorf("queued prefill %d with nothing running", q)
	}
}
