package node_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet"
)

// startDelegateNet starts n nodes: node 0 serves another model only, the others serve model,
// so node 0 is outside model's domain and must delegate its requests.
func startDelegateNet(t *testing.T, n int, configure func(i int, cfg *node.Config)) *testnet.Net {
	t.Helper()
	return startNet(t, n, func(i int, cfg *node.Config) {
		if i == 0 {
			cfg.Models = []string{"another-model"}
		}
		if configure != nil {
			configure(i, cfg)
		}
	})
}

// chainOf is the block chain of a one-message chat prompt.
func chainOf(content string) []uint64 {
	return kvindex.AppendBlocks(nil, model, kvindex.RenderChat(nil, []kvindex.Message{{Role: "user", Content: content}}), kvindex.DefaultBlockTokens)
}

// TestDelegatedRoutingFindsThePrefix pins delegated routing: requests for a model sent to a
// node that serves another are routed by a member of the model's domain, which knows where
// their prefixes are. Eight long prompts with distinct prefixes run first through the
// model's own nodes; each is then repeated twice through the other-model node (once whole,
// once streamed), and every repeat reaches the node holding its prefix, read from its cached
// tokens and X-Kvmesh-Node. Routed blind, as the node outside the domain did, each repeat
// found its holder one time in three.
func TestDelegatedRoutingFindsThePrefix(t *testing.T) {
	tn := startDelegateNet(t, 4, nil)
	urls := tn.URLs()
	const prompts = 8
	contents := make([]string, prompts)
	holders := make([]string, prompts)
	for i := range prompts {
		contents[i] = longPrompt(fmt.Sprintf("delegated %d", i), 2000)
		holders[i] = warm(t, urls[1+i%3], chatBody(contents[i], 2, false))
	}
	// Every member of the domain learns every holder, so that whichever of them the A node
	// delegates to knows it.
	for _, nd := range tn.Nodes[1:] {
		for i := range prompts {
			chain := chainOf(contents[i])
			poll.Until(t, 5*time.Second, "the domain to learn the prefixes", func() bool { return nd.PrefixOf(holders[i], chain) >= 64 })
		}
	}
	explain := map[string]string{node.HeaderExplain: "1"}
	for i := range prompts {
		for _, stream := range []bool{false, true} {
			resp := post(t, urls[0], "/v1/chat/completions", chatBody(contents[i], 2, stream), explain)
			b := readAll(t, resp)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("prompt %d (stream %v): %d %s", i, stream, resp.StatusCode, b)
			}
			if got := resp.Header.Get(node.HeaderNode); got != holders[i] {
				t.Errorf("prompt %d (stream %v) ran on %s, want its prefix holder %s (explain: %s)", i, stream, got, holders[i],
					resp.Header.Get(node.HeaderExplain))
			}
			if e := resp.Header.Get(node.HeaderExplain); !strings.HasPrefix(e, "delegate=") {
				t.Errorf("prompt %d: %s %q does not name the delegate", i, node.HeaderExplain, e)
			}
			var cached int
			if stream {
				cached = streamUsage(t, sseEvents(t, b)).PromptTokensDetails.CachedTokens
			} else {
				cached = decodeUsage(t, b).PromptTokensDetails.CachedTokens
			}
			if cached < 1000 {
				t.Errorf("prompt %d (stream %v): %d cached tokens, want most of its 2000", i, stream, cached)
			}
		}
	}
	if got := metric(t, urls[0], "kvmesh_route_delegated_total", `outcome="delegated"`); got != 2*prompts {
		t.Errorf("delegated %v requests, want %d", got, 2*prompts)
	}
	var served float64
	for _, u := range urls[1:] {
		served += metric(t, u, "kvmesh_route_delegated_total", `outcome="served"`)
	}
	if served != 2*prompts {
		t.Errorf("the domain served %v delegations, want %d", served, 2*prompts)
	}
	reconciles(t, urls)
}

// TestDelegateDownFallsBack pins that delegation never loses a request: with the delegate's
// transport dead (gossip still lists it alive), the A node routes the request itself, to the
// other member, and it completes; so does one with route.delegate off, which never tries.
func TestDelegateDownFallsBack(t *testing.T) {
	tn := startDelegateNet(t, 3, func(i int, cfg *node.Config) {
		if i == 0 {
			cfg.HandshakeTimeout = 300 * time.Millisecond
		}
	})
	urls := tn.URLs()
	body := chatBody(longPrompt("fallback", 500), 4, true)
	resp := post(t, urls[0], "/v1/chat/completions", body, map[string]string{node.HeaderExplain: "1"})
	readAll(t, resp)
	delegate, _, _ := strings.Cut(strings.TrimPrefix(resp.Header.Get(node.HeaderExplain), "delegate="), ";")
	d := indexOf(t, tn, delegate)
	if d == 0 {
		t.Fatalf("the delegate is the A node: %s", resp.Header.Get(node.HeaderExplain))
	}
	if err := tn.Nodes[d].KillTransport(); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		resp := post(t, urls[0], "/v1/chat/completions", body, nil)
		b := readAll(t, resp)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "[DONE]") {
			t.Fatalf("request %d with the delegate down: %d %s", i, resp.StatusCode, b)
		}
		if got := resp.Header.Get(node.HeaderNode); got == delegate {
			t.Fatalf("request %d ran on the dead delegate %s", i, got)
		}
	}
	if got := metric(t, urls[0], "kvmesh_route_delegated_total", `outcome="fallback"`); got < 1 {
		t.Errorf("fallback = %v, want at least 1", got)
	}
	reconciles(t, []string{urls[0]})
}

// TestDelegationOff pins route.delegate false: the node outside the domain routes the
// request itself, and counts no delegation.
func TestDelegationOff(t *testing.T) {
	off := false
	tn := startDelegateNet(t, 2, func(i int, cfg *node.Config) { cfg.Route.Delegate = &off })
	urls := tn.URLs()
	resp := post(t, urls[0], "/v1/chat/completions", chatBody("hello", 4, false), map[string]string{node.HeaderExplain: "1"})
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if e := resp.Header.Get(node.HeaderExplain); strings.Contains(e, "delegate=") {
		t.Errorf("%s %q names a delegate with delegation off", node.HeaderExplain, e)
	}
	if got := metric(t, urls[0], "kvmesh_route_delegated_total", ""); got != 0 {
		t.Errorf("%v delegations counted with delegation off", got)
	}
	reconciles(t, urls)
}

// decodeUsage is the usage of a whole chat or completions response.
func decodeUsage(t *testing.T, b []byte) usage {
	t.Helper()
	var out struct {
		Usage usage `json:"usage"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return out.Usage
}
