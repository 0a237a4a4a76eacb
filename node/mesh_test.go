package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet"
)

// indexOf finds the testnet index of a node name.
func indexOf(t testing.TB, tn *testnet.Net, name string) int {
	t.Helper()
	for i, n := range tn.Nodes {
		if n.Name() == name {
			return i
		}
	}
	t.Fatalf("no node %q", name)
	return -1
}

// knowsPrefix reports whether the node at url sees owner holding at least as many blocks as
// a chain of blocks blocks has anchors: gossip carries only anchors.
func knowsPrefix(t testing.TB, url, owner string, blocks int) bool {
	for _, p := range peers(t, url).Peers {
		if p.Name == owner && p.PrefixBlocks >= anchorsIn(blocks) {
			return true
		}
	}
	return false
}

// warm runs body once on the node at url and returns the node that ran it.
func warm(t testing.TB, url, body string) string {
	t.Helper()
	resp := post(t, url, "/v1/chat/completions", body, nil)
	if b := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("warm-up: %d %s", resp.StatusCode, b)
	}
	return resp.Header.Get(node.HeaderNode)
}

// placePrefix runs body once (at the first node), then picks another node as the ingress and
// waits until gossip has told it where the prompt's prefix lives. It returns the owner's and
// the ingress's indexes.
func placePrefix(t testing.TB, tn *testnet.Net, body string) (owner, ingress int) {
	t.Helper()
	urls := tn.URLs()
	name := warm(t, urls[0], body)
	owner = indexOf(t, tn, name)
	ingress = (owner + 1) % len(urls)
	poll.Until(t, 5*time.Second, "the prefix to spread", func() bool { return knowsPrefix(t, urls[ingress], name, 100) })
	return owner, ingress
}

// anchorsIn is how many anchors (kvindex.Anchor) a chain of n blocks has.
func anchorsIn(n int) int {
	return len(kvindex.AppendAnchors(nil, make([]uint64, n)))
}

// TestPeersIndexOnlyAnchors pins that a long prompt reaches a peer's index as its anchors
// alone (300 blocks: the 7 head anchors, then 127, 191 and 255), which match it to 256 blocks.
func TestPeersIndexOnlyAnchors(t *testing.T) {
	tn := startNet(t, 2, nil)
	content := longPrompt("anchored", 300*16)
	owner := warm(t, tn.URLs()[0], chatBody(content, 2, false))
	viewer := tn.Nodes[1-indexOf(t, tn, owner)]
	chain := kvindex.AppendBlocks(nil, model, kvindex.RenderChat(nil, []kvindex.Message{{Role: "user", Content: content}}), kvindex.DefaultBlockTokens)
	if len(chain) != 300 {
		t.Fatalf("the prompt has %d blocks, want 300", len(chain))
	}
	poll.Until(t, 5*time.Second, "the viewer to learn the owner's prefix", func() bool { return viewer.PrefixOf(owner, chain) == 256 })
	want := kvindex.AppendAnchors(nil, chain)
	if len(want) != 10 {
		t.Fatalf("%d anchors, want 10", len(want))
	}
	got := viewer.IndexedBlocks(owner)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("the viewer indexes %d blocks of the owner's, want its 10 anchors", len(got))
	}
}

func TestSecondTurnFollowsThePrefixAcrossIngresses(t *testing.T) {
	tn := startNet(t, 3, nil)
	urls := tn.URLs()
	body := chatBody(longPrompt("follow", 3000), 4, true)
	owner := warm(t, urls[0], body)
	if owner == "" {
		t.Fatal("no X-Kvmesh-Node")
	}
	// The second turn enters at a node that is not the owner, and not the first ingress when
	// there is a third: only gossip can have told it where the prefix is.
	o := indexOf(t, tn, owner)
	b := (o + 1) % 3
	if b == 0 {
		b = (o + 2) % 3
	}
	poll.Until(t, 5*time.Second, "the prefix to reach the other ingress", func() bool { return knowsPrefix(t, urls[b], owner, 100) })
	resp := post(t, urls[b], "/v1/chat/completions", body, nil)
	ev := sseEvents(t, readAll(t, resp))
	if got := resp.Header.Get(node.HeaderNode); got != owner {
		t.Fatalf("second request ran on %s, want the prefix owner %s", got, owner)
	}
	if u := streamUsage(t, ev); u.PromptTokensDetails.CachedTokens < 2900 {
		t.Errorf("cached %d of %d prompt tokens", u.PromptTokensDetails.CachedTokens, u.PromptTokens)
	}
}

var volatileFields = regexp.MustCompile(`"(id|created)":("[^"]*"|[0-9]+)`)

func TestForwardedStreamIsByteIdenticalToTheOwners(t *testing.T) {
	tn := startNet(t, 3, nil)
	urls := tn.URLs()
	body := chatBody(longPrompt("identical", 2000), 16, true)
	o, ingress := placePrefix(t, tn, body)
	owner := tn.Nodes[o].Name()
	direct := readAll(t, post(t, urls[o], "/v1/chat/completions", body, nil))
	resp := post(t, urls[ingress], "/v1/chat/completions", body, nil)
	forwarded := readAll(t, resp)
	if resp.Header.Get(node.HeaderNode) != owner {
		t.Fatalf("forwarded request ran on %s, want %s", resp.Header.Get(node.HeaderNode), owner)
	}
	// Each request has its own id and timestamp; every other byte must match.
	d := volatileFields.ReplaceAll(direct, []byte(`"$1":0`))
	f := volatileFields.ReplaceAll(forwarded, []byte(`"$1":0`))
	if string(d) != string(f) {
		t.Errorf("forwarded stream differs from the owner's:\n direct:    %q\n forwarded: %q", d, f)
	}
}

func TestOwnerDeadBeforeFirstByteIsRetriedElsewhere(t *testing.T) {
	tn := startNet(t, 3, nil)
	urls := tn.URLs()
	body := chatBody(longPrompt("retry", 3000), 4, false)
	o, ingress := placePrefix(t, tn, body)
	owner := tn.Nodes[o].Name()
	if err := tn.Nodes[o].KillTransport(); err != nil {
		t.Fatal(err)
	}
	resp := post(t, urls[ingress], "/v1/chat/completions", body, map[string]string{node.HeaderExplain: "1"})
	b := readAll(t, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if got := resp.Header.Get(node.HeaderNode); got == owner || got == "" {
		t.Errorf("ran on %q; the dead owner %s cannot have run it", got, owner)
	}
	if !strings.Contains(resp.Header.Get(node.HeaderExplain), owner) {
		t.Errorf("explain %q does not show the owner was the first choice", resp.Header.Get(node.HeaderExplain))
	}
	if got := metric(t, urls[ingress], "kvmesh_forward_attempts_total", `result="unreachable"`); got < 1 {
		t.Errorf("the ingress never tried the dead owner (unreachable attempts %v)", got)
	}
}

// TestOwnerDeathMidStreamEndsWithAnErrorEvent pins the end of a stream whose owner dies when
// migration is off (--migrations -1): an explicit error event, never a silently short answer,
// and the move counted refused.
func TestOwnerDeathMidStreamEndsWithAnErrorEvent(t *testing.T) {
	tn := startNet(t, 2, func(i int, cfg *node.Config) { cfg.Sim.TimeScale, cfg.Migrations = 1, -1 })
	urls := tn.URLs()
	prompt := longPrompt("midstream", 3000)
	o, ingress := placePrefix(t, tn, chatBody(prompt, 2, false))
	owner := tn.Nodes[o].Name()
	resp := post(t, urls[ingress], "/v1/chat/completions", chatBody(prompt, 4000, true), nil)
	if resp.StatusCode != 200 || resp.Header.Get(node.HeaderNode) != owner {
		t.Fatalf("status %d on %s", resp.StatusCode, resp.Header.Get(node.HeaderNode))
	}
	buf := make([]byte, 512)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	if err := tn.Nodes[o].KillTransport(); err != nil {
		t.Fatal(err)
	}
	ev := sseEvents(t, readAll(t, resp))
	if len(ev) == 0 || ev[len(ev)-1] == "[DONE]" || !strings.Contains(ev[len(ev)-1], `"error"`) {
		t.Fatalf("stream ended with %q, want an error event", ev[max(len(ev)-1, 0):])
	}
	if n := metric(t, urls[ingress], "kvmesh_migrations_total", `outcome="refused"`); n != 1 {
		t.Errorf("migrations refused = %v, want 1", n)
	}
}

func TestClientDisconnectCancelsWorkOnTheOwner(t *testing.T) {
	tn := startNet(t, 2, func(i int, cfg *node.Config) { cfg.Sim.TimeScale = 1 })
	urls := tn.URLs()
	prompt := longPrompt("cancel", 3000)
	o, ingress := placePrefix(t, tn, chatBody(prompt, 2, false))
	owner := tn.Nodes[o].Name()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, urls[ingress]+"/v1/chat/completions", strings.NewReader(chatBody(prompt, 4000, true)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.Get(node.HeaderNode) != owner {
		t.Fatalf("ran on %s, want %s", resp.Header.Get(node.HeaderNode), owner)
	}
	buf := make([]byte, 512)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "the owner to run it", func() bool { return selfOf(peers(t, urls[o])).Running == 1 })
	cancel()
	resp.Body.Close()
	poll.Until(t, 5*time.Second, "the owner's engine to drop the work", func() bool { return selfOf(peers(t, urls[o])).Running == 0 })
}

func TestMeshPeersView(t *testing.T) {
	tn := startNet(t, 3, nil)
	pr := peers(t, tn.URLs()[1])
	if pr.Node != "n2" || len(pr.Peers) != 3 {
		t.Fatalf("view %+v", pr)
	}
	for _, p := range pr.Peers {
		if p.Liveness != "alive" || p.QUICAddr == "" || p.HTTPAddr == "" || len(p.Models) != 1 || p.KVBlocksTotal == 0 {
			t.Errorf("peer %+v", p)
		}
	}
}

func TestHotPrefixSpreadsUnderLoadAndReturnsWhenDrained(t *testing.T) {
	tn := startNet(t, 4, func(i int, cfg *node.Config) {
		cfg.Sim.KVBlocks = 1024
		cfg.Sim.TimeScale = 2
	})
	urls := tn.URLs()
	shared := longPrompt("hot system prompt", 2000)
	owner := warm(t, urls[0], chatBody(shared, 2, false))
	for _, u := range urls {
		poll.Until(t, 5*time.Second, "the prefix to spread", func() bool { return u == urls[indexOf(t, tn, owner)] || knowsPrefix(t, u, owner, 100) })
	}
	// A burst of 16 requests sharing the hot prefix, each with 1,500 tokens of its own: the
	// owner can hold about seven at once.
	var mu sync.Mutex
	ran := map[string]int{}
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := post(t, urls[i%4], "/v1/chat/completions", chatBody(shared+longPrompt(fmt.Sprint("user ", i), 1500), 200, false), nil)
			readAll(t, resp)
			mu.Lock()
			ran[resp.Header.Get(node.HeaderNode)]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	t.Logf("burst of 16 ran %v; prefix owner %s", ran, owner)
	if len(ran) < 2 || ran[owner] == 16 {
		t.Fatalf("burst ran %v: it should spread beyond the busy prefix owner %s", ran, owner)
	}
	if ran[owner] < 3 {
		t.Errorf("burst ran %v: the prefix owner should still take its share", ran)
	}
	// Drained, the next turn goes back to a node holding the prefix.
	resp := post(t, urls[3], "/v1/chat/completions", chatBody(shared+"one more question", 4, true), nil)
	u := streamUsage(t, sseEvents(t, readAll(t, resp)))
	if u.PromptTokensDetails.CachedTokens < 1990 {
		t.Errorf("after the burst the request ran on %s with %d cached tokens; want a prefix holder", resp.Header.Get(node.HeaderNode), u.PromptTokensDetails.CachedTokens)
	}
}

// TestPeersJSONIsSnakeCase pins that every key GET /v1/mesh/peers sends, nested ones
// included, is snake_case.
func TestPeersJSONIsSnakeCase(t *testing.T) {
	tn := startNet(t, 1, nil)
	resp, err := http.Get(tn.URLs()[0] + "/v1/mesh/peers")
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(readAll(t, resp), &v); err != nil {
		t.Fatal(err)
	}
	snake := regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				if !snake.MatchString(k) {
					t.Errorf("key %s.%s is not snake_case", path, k)
				}
				walk(path+"."+k, e)
			}
		case []any:
			for i, e := range v {
				walk(fmt.Sprintf("%s[%d]", path, i), e)
			}
		}
	}
	walk("", v)
}
