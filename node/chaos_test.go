package node_test

// The chaos suite: peers that die, freeze or split off, and an engine that restarts, while
// requests run. Each test pins that every request ends, within chaosTimeout, in a completion
// or an explicit error; that every node's accounting reconciles (received = completed +
// refused + failed); and that no goroutine outlives the test (noLeaks).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet"
)

// chaosTimeout bounds every request of the chaos suite: one that has not ended by then hung.
const chaosTimeout = 20 * time.Second

// cutter drops the gossip between the nodes a test cuts apart (gossip.Config.Drop): a
// partition, or a node cut off from all others, as a frozen or crashed process is.
type cutter struct {
	mu   sync.Mutex
	addr map[string]int  // gossip address → node index
	cut  map[[2]int]bool // from, to
}

func newCutter() *cutter { return &cutter{addr: map[string]int{}, cut: map[[2]int]bool{}} }

// configure is startNet's configure for node i: its gossip drops what the cutter cuts, and
// its forwards give up on a dead peer's handshake after 300 ms.
func (c *cutter) configure(i int, cfg *node.Config) {
	cfg.Gossip.Drop = func(to string) bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		j, ok := c.addr[to]
		return ok && c.cut[[2]int{i, j}]
	}
	cfg.HandshakeTimeout = 300 * time.Millisecond
}

// startChaos checks the test for leaks (noLeaks) and starts n nodes whose gossip a cutter
// controls; configure, if set, adjusts each node further.
func startChaos(t *testing.T, n int, configure func(i int, cfg *node.Config)) (*cutter, *testnet.Net) {
	t.Helper()
	noLeaks(t)
	c := newCutter()
	tn := startNet(t, n, func(i int, cfg *node.Config) {
		c.configure(i, cfg)
		if configure != nil {
			configure(i, cfg)
		}
	})
	c.learn(tn)
	return c, tn
}

// learn records the gossip addresses of tn's nodes.
func (c *cutter) learn(tn *testnet.Net) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, n := range tn.Nodes {
		c.addr[n.GossipAddr()] = i
	}
}

// split cuts the gossip between every node of a and every node of b, both ways.
func (c *cutter) split(a, b []int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, i := range a {
		for _, j := range b {
			c.cut[[2]int{i, j}], c.cut[[2]int{j, i}] = true, true
		}
	}
}

// heal ends every cut and waits until every node of tn sees every other alive and fresh.
func (c *cutter) heal(t *testing.T, tn *testnet.Net) {
	t.Helper()
	c.mu.Lock()
	clear(c.cut)
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tn.WaitConverged(ctx); err != nil {
		t.Fatalf("after the cut healed: %v", err)
	}
}

// kill stops node i abruptly, as a crash would: its gossip goes silent and its transport
// closes, with no drain and no departure. Its HTTP API stays up, for its metrics.
func (c *cutter) kill(t testing.TB, tn *testnet.Net, i int) {
	t.Helper()
	var others []int
	for j := range tn.Nodes {
		if j != i {
			others = append(others, j)
		}
	}
	c.split([]int{i}, others)
	if err := tn.Nodes[i].KillTransport(); err != nil {
		t.Fatal(err)
	}
}

// ending is how one request ended, as its client saw it.
type ending struct {
	status int
	node   string // X-Kvmesh-Node
	done   bool   // a completion: a 200 with its whole body, or a stream ending in [DONE]
	code   string // otherwise the error's code, from the body or the stream's error event
	err    error  // the client's own: the request did not end within chaosTimeout
}

func (e ending) String() string {
	return fmt.Sprintf("status %d on %q, done %v, code %q, err %v", e.status, e.node, e.done, e.code, e.err)
}

// request is one request of a chaos test: its target node's URL and its body.
type request struct{ url, body string }

// sendAll sends every request at once, each bounded by chaosTimeout, and delivers their
// endings, in order, once all have ended.
func sendAll(reqs []request, hdr map[string]string) <-chan []ending {
	out := make(chan []ending, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), chaosTimeout)
		defer cancel()
		es := make([]ending, len(reqs))
		var wg sync.WaitGroup
		for i, r := range reqs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				es[i] = send(ctx, r, hdr)
			}()
		}
		wg.Wait()
		out <- es
	}()
	return out
}

func send(ctx context.Context, r request, hdr map[string]string) ending {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url+"/v1/chat/completions", strings.NewReader(r.body))
	if err != nil {
		return ending{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ending{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	e := ending{status: resp.StatusCode, node: resp.Header.Get(node.HeaderNode), err: err}
	if err != nil {
		return e
	}
	var msg struct {
		Choices []json.RawMessage `json:"choices"`
		Error   struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		events := bytes.Split(bytes.TrimSpace(b), []byte("\n\n"))
		last, _ := bytes.CutPrefix(events[len(events)-1], []byte("data: "))
		if e.done = string(last) == "[DONE]"; e.done {
			return e
		}
		b = last
	}
	if json.Unmarshal(b, &msg) == nil {
		e.done = resp.StatusCode == http.StatusOK && len(msg.Choices) > 0
		e.code = msg.Error.Code
	}
	return e
}

// ended fails the test for an ending that is neither a completion nor an explicit error.
func ended(t *testing.T, what string, e ending) {
	t.Helper()
	if e.err != nil || !e.done && e.code == "" {
		t.Errorf("%s did not end in a completion or an explicit error: %v", what, e)
	}
}

// peerSeen is peer as the node at url sees it (zero if it does not list it).
func peerSeen(t *testing.T, url, peer string) node.PeerInfo {
	for _, p := range peers(t, url).Peers {
		if p.Name == peer {
			return p
		}
	}
	return node.PeerInfo{}
}

// TestChaosOwnerKilledBeforeFirstByte: the node holding a prompt's prefix dies abruptly (no
// drain, gossip silent, its transport closed) while it runs requests that have not written
// their first byte (they are not streamed: the whole answer is written at once), and gossip
// still lists it. The ingresses retry every one elsewhere (their own engine, here: a local
// attempt is no retry across the mesh, which the budget bounds), and each completes.
func TestChaosOwnerKilledBeforeFirstByte(t *testing.T) {
	c, tn := startChaos(t, 3, func(i int, cfg *node.Config) {
		cfg.Sim.TimeScale = 1 // 200 tokens take about a second to decode: the owner dies meanwhile
	})
	urls := tn.URLs()
	prefix := longPrompt("chaos owner", 2000)
	o, _ := placePrefix(t, tn, chatBody(prefix, 2, false))
	owner := tn.Nodes[o].Name()
	var reqs []request
	for i := range 4 {
		reqs = append(reqs, request{urls[(o+1+i%2)%3], chatBody(prefix+fmt.Sprint(" question ", i), 200, false)})
	}
	endings := sendAll(reqs, nil)
	poll.Until(t, 10*time.Second, "the owner to run the requests", func() bool { return selfOf(peers(t, urls[o])).Running >= 1 })
	c.kill(t, tn, o)
	for i, e := range <-endings {
		if !e.done || e.node == owner {
			t.Errorf("request %d: %v; want a completion on a live node", i, e)
		}
	}
	var unreachable float64
	for i, u := range urls {
		if i != o {
			unreachable += metric(t, u, "kvmesh_forward_attempts_total", `result="unreachable"`)
		}
	}
	if unreachable < 1 {
		t.Errorf("no forward attempt was unreachable: the requests never met the dead owner")
	}
	reconciles(t, urls)
}

// TestChaosOwnerKilledWhileRequestsQueue: every engine is full, so requests wait in the
// ingress's waiting room, when one of the nodes dies abruptly. Its running request, a stream,
// ends with an error event; those waiting are served by the live nodes once they have room,
// or end with an explicit error, never on the dead node and never hanging.
func TestChaosOwnerKilledWhileRequestsQueue(t *testing.T) {
	c, tn := startChaos(t, 3, func(i int, cfg *node.Config) {
		cfg.Sim.TimeScale = 1
		cfg.Sim.KVBlocks = 320 // 5,120 tokens: a 4,000-token request leaves no room for another
	})
	urls := tn.URLs()
	var blockers, waiters []request
	for i := range 3 {
		blockers = append(blockers, request{urls[0], chatBody(longPrompt(fmt.Sprint("blocker ", i), 4000), 200, true)})
	}
	for i := range 4 {
		waiters = append(waiters, request{urls[0], chatBody(longPrompt(fmt.Sprint("waiter ", i), 4000), 4, false)})
	}
	blocked := sendAll(blockers, nil)
	poll.Until(t, 10*time.Second, "a blocker on every engine", func() bool {
		for _, u := range urls {
			if selfOf(peers(t, u)).Running < 1 {
				return false
			}
		}
		return true
	})
	// Low priority: a 30 s TTFT target, so they wait rather than being refused as late.
	waited := sendAll(waiters, map[string]string{node.HeaderPriority: "low"})
	poll.Until(t, 10*time.Second, "the waiters to queue at n1", func() bool {
		return metric(t, urls[0], "kvmesh_admission_queue_requests", "") >= 4
	})
	const dead = 1
	c.kill(t, tn, dead)
	for i, e := range <-blocked {
		ended(t, fmt.Sprint("blocker ", i), e)
	}
	for i, e := range <-waited {
		ended(t, fmt.Sprint("waiter ", i), e)
		if e.done && e.node == tn.Nodes[dead].Name() {
			t.Errorf("waiter %d ran on the dead node: %v", i, e)
		}
	}
	reconciles(t, urls)
}

// TestChaosFrozenPeerIsNoCandidateWhileStale: a peer frozen (as by SIGSTOP; here its gossip
// is cut both ways, in process, while its API and engine keep running) for longer than the
// stale threshold (1 s) stops being a candidate on every other node, requests entering them
// run on the others, and once it thaws it is a candidate again everywhere and serves.
func TestChaosFrozenPeerIsNoCandidateWhileStale(t *testing.T) {
	c, tn := startChaos(t, 3, nil)
	urls := tn.URLs()
	const frozen = 2
	name := tn.Nodes[frozen].Name()
	c.split([]int{frozen}, []int{0, 1})
	poll.Until(t, 10*time.Second, "the frozen peer to go stale and out of routing", func() bool {
		for _, u := range urls[:frozen] {
			if p := peerSeen(t, u, name); p.Candidate || !p.Stale {
				return false
			}
		}
		return true
	})
	var reqs []request
	for i := range 6 {
		reqs = append(reqs, request{urls[i%2], chatBody(longPrompt(fmt.Sprint("frozen ", i), 500), 4, false)})
	}
	for i, e := range <-sendAll(reqs, nil) {
		if !e.done || e.node == name {
			t.Errorf("request %d while %s is frozen: %v; want a completion on another node", i, name, e)
		}
	}
	c.heal(t, tn)
	reqs = reqs[:0]
	for i := range 3 {
		reqs = append(reqs, request{urls[i], chatBody(longPrompt(fmt.Sprint("thawed ", i), 500), 4, false)})
	}
	for i, e := range <-sendAll(reqs, nil) {
		if !e.done {
			t.Errorf("request %d after the thaw: %v", i, e)
		}
	}
	reconciles(t, urls)
}

// TestChaosHealedPartitionConverges: gossip splits {n1, n2} from {n3} until each side holds
// the other dead; each serves alone, and a prefix placed on each side stays there. Once the
// partition heals, every node sees every other again (the members held dead are joined
// again), each side learns the prefix the other computed meanwhile, and routing follows it:
// a next turn entering at n1 runs on n3.
func TestChaosHealedPartitionConverges(t *testing.T) {
	c, tn := startChaos(t, 3, nil)
	urls := tn.URLs()
	c.split([]int{0, 1}, []int{2})
	// Dead and stale: the verdict is old enough that memberlist's own messages about it are
	// spent, and only a new contact can bring the sides together again.
	gone := func(url, peer string) bool {
		p := peerSeen(t, url, peer)
		return !p.Candidate && p.Liveness == "dead" && p.Stale
	}
	poll.Until(t, 10*time.Second, "each side to hold the other dead", func() bool {
		return gone(urls[0], "n3") && gone(urls[1], "n3") && gone(urls[2], "n1") && gone(urls[2], "n2")
	})
	a, b := longPrompt("partition a", 2000), longPrompt("partition b", 2000)
	onA := <-sendAll([]request{{urls[2], chatBody(a, 2, false)}}, nil)
	onB := <-sendAll([]request{{urls[0], chatBody(b, 2, false)}}, nil)
	if !onA[0].done || onA[0].node != "n3" || !onB[0].done || onB[0].node == "n3" {
		t.Fatalf("during the partition: %v and %v; want each served on its own side", onA[0], onB[0])
	}
	c.heal(t, tn)
	poll.Until(t, 10*time.Second, "each side to learn the other's prefix", func() bool {
		return knowsPrefix(t, urls[0], "n3", 100) && knowsPrefix(t, urls[1], "n3", 100) && knowsPrefix(t, urls[2], onB[0].node, 100)
	})
	next := <-sendAll([]request{{urls[0], chatBody(a+" and then?", 2, false)}}, nil)
	if !next[0].done || next[0].node != "n3" {
		t.Errorf("the next turn of n3's prompt, at n1: %v; want it on n3", next[0])
	}
	reconciles(t, urls)
}

// TestChaosExternalEngineRestart: the external engine behind n1 dies abruptly and comes back
// on the same address. n1 turns unready and its requests run on n2 meanwhile; once the
// engine answers, n1 is ready again with its model of the engine's cache emptied (the cache
// died with the engine) and serves.
func TestChaosExternalEngineRestart(t *testing.T) {
	noLeaks(t)
	noDelay := func(cfg *node.Config) { cfg.DrainDelay = -1 }
	e, engineURL, err := startStandalone(t, noDelay)
	if err != nil {
		t.Fatal(err)
	}
	addr := e.HTTPAddr()
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		if i == 0 {
			cfg.Engine, cfg.EngineKind, cfg.ModelsInterval = engineURL, "vllm", 20*time.Millisecond
		}
	})
	urls := tn.URLs()
	// The engine dies: its connections close at once, without a drain.
	dead, cancel := context.WithCancel(context.Background())
	cancel()
	_ = e.Shutdown(dead)
	poll.Until(t, 10*time.Second, "n1 to turn unready", func() bool { status, _ := readyz(t, urls[0]); return status == http.StatusServiceUnavailable })
	errors0 := metric(t, urls[0], "kvmesh_engine_scrape_errors_total", "")
	poll.Until(t, 10*time.Second, "a scrape to find the engine gone", func() bool {
		return metric(t, urls[0], "kvmesh_engine_scrape_errors_total", "") > errors0
	})
	var reqs []request
	for i := range 3 {
		reqs = append(reqs, request{urls[0], chatBody(fmt.Sprint("while the engine is down ", i), 4, false)})
	}
	for i, e := range <-sendAll(reqs, nil) {
		if !e.done || e.node != "n2" {
			t.Errorf("request %d while n1's engine is down: %v; want a completion on n2", i, e)
		}
	}
	if _, _, err := startStandalone(t, func(cfg *node.Config) { noDelay(cfg); cfg.HTTPAddr = addr }); err != nil {
		t.Fatalf("restarting the engine on %s: %v", addr, err)
	}
	poll.Until(t, 10*time.Second, "n1 to be ready again", func() bool { status, _ := readyz(t, urls[0]); return status == http.StatusOK })
	poll.Until(t, 10*time.Second, "n1 to empty its model of the engine's cache", func() bool {
		return metric(t, urls[0], "kvmesh_residency_resets_total", "") >= 1
	})
	reqs = reqs[:0]
	for i := range 3 {
		reqs = append(reqs, request{urls[i%2], chatBody(fmt.Sprint("after the restart ", i), 4, false)})
	}
	for i, e := range <-sendAll(reqs, nil) {
		if !e.done {
			t.Errorf("request %d after the restart: %v", i, e)
		}
	}
	reconciles(t, urls)
}
