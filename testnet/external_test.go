package testnet_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet"
)

// TestExternalEnginesServeAndSpreadTheirPrefixes: with Engines external, each node runs in
// front of its own standalone engine, taking that engine's model and KV size from it; the mesh
// converges, serves through either node, and what one node's engine caches reaches the other
// node through gossip (speculative entries expire at once, so only the residency model's
// report can tell it).
func TestExternalEnginesServeAndSpreadTheirPrefixes(t *testing.T) {
	const kvBlocks = 512
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tn, err := testnet.Start(ctx, testnet.Config{Nodes: 2, Fast: true, Engines: testnet.EnginesExternal,
		Configure: func(i int, cfg *node.Config) {
			cfg.Sim.TimeScale, cfg.Sim.KVBlocks = 50, kvBlocks
			cfg.SpeculativeTTL = time.Nanosecond
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tn.Close() })
	if len(tn.Engines) != 2 {
		t.Fatalf("%d engines for 2 nodes", len(tn.Engines))
	}
	if err := tn.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	urls := tn.URLs()
	for _, p := range peerInfos(t, urls[0]) {
		if p.EngineKind != "vllm" || p.KVBlocksTotal != kvBlocks {
			t.Errorf("%s: engine kind %q, %d KV blocks; want vllm, %d", p.Name, p.EngineKind, p.KVBlocksTotal, kvBlocks)
		}
	}

	chat := func(url, content string) string {
		t.Helper()
		body, _ := json.Marshal(map[string]any{
			"model":      node.DefaultModel,
			"messages":   []map[string]string{{"role": "user", "content": content}},
			"max_tokens": 4,
		})
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d: %s", url, resp.StatusCode, b)
		}
		return resp.Header.Get(node.HeaderNode)
	}
	for _, u := range urls {
		chat(u, "hello")
	}

	// About 1,000 tokens: over 60 blocks, more than the short chats above left anywhere.
	served := chat(urls[0], strings.Repeat("a long shared prefix ", 200))
	other := urls[1]
	if served == tn.Nodes[1].Name() {
		other = urls[0]
	}
	var seen int
	poll.Until(t, 10*time.Second, "the other node to learn the served node's long prefix by gossip", func() bool {
		for _, p := range peerInfos(t, other) {
			if p.Name == served && !p.Self {
				seen = p.PrefixBlocks
			}
		}
		return seen >= len(kvindex.AppendAnchors(nil, make([]uint64, 60))) // gossip carries anchors
	})
	t.Logf("%s served the long prompt; %s sees %d of its prefix anchors", served, other, seen)
}

func peerInfos(t *testing.T, url string) []node.PeerInfo {
	t.Helper()
	resp, err := http.Get(url + "/v1/mesh/peers")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var pr node.PeersResponse
	if err := json.NewDecoder(resp.Body).Decode(&pr); err != nil {
		t.Fatal(err)
	}
	return pr.Peers
}
