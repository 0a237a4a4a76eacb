package gossip

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/kvindex"
)

// memberlist's listeners exit on Shutdown; VerifyTestMain's built-in retries give them the
// moment they need, so no goroutine is ignored.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testKey = []byte("0123456789abcdef0123456789abcdef")

// testConfig is a loopback member with timers shortened about tenfold.
func testConfig(name string) Config {
	c := DefaultConfig()
	c.Name = name
	c.BindAddr = "127.0.0.1"
	c.BindPort = AnyPort
	c.Key = testKey
	c.PublishInterval = 200 * time.Millisecond
	c.MinPublishInterval = 20 * time.Millisecond
	c.FlushInterval = 10 * time.Millisecond
	c.PrefixInterval = 20 * time.Millisecond
	c.StaleAfter = time.Second
	c.PushPullInterval = 300 * time.Millisecond
	c.ProbeInterval = 100 * time.Millisecond
	c.ProbeTimeout = 50 * time.Millisecond
	c.GossipInterval = 20 * time.Millisecond
	c.SuspicionMult = 2
	c.TCPTimeout = 500 * time.Millisecond
	c.DeadNodeReclaimTime = time.Millisecond
	c.JoinRetryMax = 200 * time.Millisecond
	return c
}

func startNode(t *testing.T, cfg Config) *Gossip { return startServing(t, cfg, "m") }

// startServing starts a member whose record lists models.
func startServing(t testing.TB, cfg Config, models ...string) *Gossip {
	t.Helper()
	return startVia(t, cfg, nil, models...)
}

// startVia is startServing with the member's direct sends (prefix rounds, records by domain)
// going through keep first, when it is not nil: a message keep refuses is lost on the way
// out, as a lossy network loses it.
func startVia(t testing.TB, cfg Config, keep func(g *Gossip, msg []byte) bool, models ...string) *Gossip {
	t.Helper()
	var f *filtered
	if keep != nil {
		f = &filtered{keep: keep}
	}
	g, err := newGossip(cfg, f.sender())
	if err != nil {
		t.Fatal(err)
	}
	if f != nil {
		f.g = g // before Start, which starts the rounds that call it
	}
	st := State{HTTPAddr: "127.0.0.1:0", EngineHealthy: true}
	for _, m := range models {
		st.Models = append(st.Models, ModelInfo{Name: m, ContextTokens: 8192})
	}
	g.UpdateLocal(st)
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	return g
}

// filtered is a directSender that sends through its member's memberlist what keep lets
// through and loses the rest without a word.
type filtered struct {
	g    *Gossip
	keep func(g *Gossip, msg []byte) bool
}

// sender is f as a directSender, nil for a nil f (memberlist's own).
func (f *filtered) sender() directSender {
	if f == nil {
		return nil
	}
	return f
}

func (f *filtered) SendToAddress(a memberlist.Address, msg []byte) error {
	if !f.keep(f.g, msg) {
		return nil
	}
	f.g.mu.Lock()
	ml := f.g.ml
	f.g.mu.Unlock()
	return ml.SendToAddress(a, msg)
}

// startCluster starts n members, each joining the first.
func startCluster(t *testing.T, n int, mod func(i int, c *Config)) []*Gossip {
	t.Helper()
	return startClusterVia(t, n, mod, nil)
}

// startClusterVia is startCluster with every member's direct sends going through keep
// (startVia).
func startClusterVia(t *testing.T, n int, mod func(i int, c *Config), keep func(g *Gossip, msg []byte) bool) []*Gossip {
	t.Helper()
	var gs []*Gossip
	for i := 0; i < n; i++ {
		c := testConfig(fmt.Sprintf("n%d", i))
		if i > 0 {
			c.Join = []string{gs[0].LocalAddr()}
		}
		if mod != nil {
			mod(i, &c)
		}
		gs = append(gs, startVia(t, c, keep, "m"))
	}
	return gs
}

// kill stops a member without leaving, as a crash would.
func kill(g *Gossip) { _ = g.shutdown(false, 0) }

func member(g *Gossip, name string) (Member, bool) {
	for _, m := range g.Members() {
		if m.Name == name {
			return m, true
		}
	}
	return Member{}, false
}

func allAlive(gs []*Gossip, names ...string) bool {
	for _, g := range gs {
		for _, n := range names {
			m, ok := member(g, n)
			if !ok || m.Liveness != LivenessAlive || m.State.BootID == 0 {
				return false
			}
		}
	}
	return true
}

// count is the number of members g lists with liveness l.
func count(g *Gossip, l Liveness) int {
	n := 0
	for _, m := range g.Members() {
		if m.Liveness == l {
			n++
		}
	}
	return n
}

func names(gs []*Gossip) []string {
	var out []string
	for _, g := range gs {
		out = append(out, g.Name())
	}
	return out
}

func prefixLen(g *Gossip, peer string, blocks []uint64) int {
	for _, m := range g.LongestPrefix(blocks, nil) {
		if m.Peer == peer {
			return m.Blocks
		}
	}
	return 0
}

// everyoneSees reports whether every node matches want blocks of blocks for peer: the anchored
// length of what peer holds (kvindex.AnchoredLen).
func everyoneSees(gs []*Gossip, peer string, blocks []uint64, want int) bool {
	for _, g := range gs {
		if prefixLen(g, peer, blocks) != want {
			return false
		}
	}
	return true
}

func promptBlocks(text string) []uint64 {
	p := make([]byte, 0, 64*40)
	for len(p) < 64*40 {
		p = append(p, text...)
	}
	return kvindex.Blocks("m", p, 16) // 40 blocks
}

func TestMeshLifecycle(t *testing.T) {
	gs := startCluster(t, 5, nil)
	all := names(gs)
	poll.Until(t, 10*time.Second, "5 nodes all alive in every view", func() bool { return allAlive(gs, all...) })
	for _, g := range gs {
		if got := len(g.Members()); got != 5 {
			t.Fatalf("%s lists %d members", g.Name(), got)
		}
		if v := testutil.ToFloat64(g.met.members.WithLabelValues("alive")); v != 5 {
			t.Fatalf("%s members{alive} = %v", g.Name(), v)
		}
	}

	blocks := promptBlocks("a long system prompt shared by a session. ")
	t.Run("stored prefix reaches every index", func(t *testing.T) {
		gs[1].PrefixStored(blocks)
		poll.Until(t, 10*time.Second, "n1's prefix everywhere", func() bool { return everyoneSees(gs, "n1", blocks, kvindex.AnchoredLen(40)) })
		if m, _ := member(gs[0], "n1"); m.PrefixBlocks != len(blocks) {
			t.Fatalf("PrefixBlocks = %d", m.PrefixBlocks)
		}
	})
	t.Run("eviction deltas propagate", func(t *testing.T) {
		gs[1].PrefixEvicted(blocks[30:])
		poll.Until(t, 10*time.Second, "eviction everywhere", func() bool { return everyoneSees(gs, "n1", blocks, kvindex.AnchoredLen(30)) })
	})

	victim := gs[4]
	victim.PrefixStored(blocks[:10])
	poll.Until(t, 10*time.Second, "n4's prefix everywhere", func() bool { return everyoneSees(gs, "n4", blocks, kvindex.AnchoredLen(10)) })
	t.Run("killed node becomes dead and its prefixes are dropped", func(t *testing.T) {
		kill(victim)
		poll.Until(t, 10*time.Second, "n4 dead everywhere", func() bool {
			for _, g := range gs[:4] {
				m, _ := member(g, "n4")
				if m.Liveness != LivenessDead || m.PrefixBlocks != 0 || prefixLen(g, "n4", blocks) != 0 || m.Candidate {
					return false
				}
			}
			return true
		})
	})
	t.Run("restarted node rejoins with a new incarnation and no stale prefixes", func(t *testing.T) {
		c := testConfig("n4")
		c.Join = []string{gs[0].LocalAddr()}
		reborn := startNode(t, c)
		fresh := promptBlocks("something else entirely. ")
		reborn.PrefixStored(fresh[:5])
		rest := append(slices.Clone(gs[:4]), reborn)
		poll.Until(t, 10*time.Second, "n4 alive again with its new prefix", func() bool {
			for _, g := range rest[:4] {
				m, _ := member(g, "n4")
				if m.Liveness != LivenessAlive || m.State.BootID != reborn.bootID || m.Incarnation != 2 ||
					prefixLen(g, "n4", fresh) != kvindex.AnchoredLen(5) {
					return false
				}
			}
			return true
		})
		for _, g := range rest[:4] {
			if n := prefixLen(g, "n4", blocks); n != 0 {
				t.Fatalf("%s still credits n4 with %d old blocks", g.Name(), n)
			}
		}
	})
	t.Run("a node that leaves is left, not dead, everywhere", func(t *testing.T) {
		// Leave returns once its departure is out; the long timeout is for a loaded machine,
		// where a departure cut short is a death to the peers, not a departure.
		if err := gs[3].Leave(5 * time.Second); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, 20*time.Second, "n3 left in every view", func() bool {
			for _, g := range gs[:3] {
				// The reborn n4 left as its subtest ended, or is dead where its departure was
				// lost on a loaded machine: the gauge counts whichever each view holds.
				if m, _ := member(g, "n3"); m.Liveness != LivenessLeft || m.Candidate ||
					testutil.ToFloat64(g.met.members.WithLabelValues("left")) != float64(count(g, LivenessLeft)) {
					return false
				}
			}
			return true
		})
	})
}

func TestSnapshotRepairsDroppedDeltas(t *testing.T) {
	// Every delta of n2 is lost on the way out.
	gs := startClusterVia(t, 3, nil, func(g *Gossip, msg []byte) bool { return g.Name() != "n2" || msg[1] != msgDelta })
	poll.Until(t, 10*time.Second, "3 alive", func() bool { return allAlive(gs, names(gs)...) })
	blocks := promptBlocks("repair me. ")
	gs[2].PrefixStored(blocks)
	poll.Until(t, 10*time.Second, "push/pull delivers n2's residency", func() bool { return everyoneSees(gs, "n2", blocks, kvindex.AnchoredLen(40)) })
	gs[2].PrefixEvicted(blocks[5:])
	poll.Until(t, 10*time.Second, "push/pull delivers n2's eviction", func() bool { return everyoneSees(gs, "n2", blocks, kvindex.AnchoredLen(5)) })
}

func TestSnapshotFunction(t *testing.T) {
	gs := startCluster(t, 2, nil)
	blocks := promptBlocks("engine-reported residency. ")
	gs[1].SetSnapshot(func() []uint64 { return blocks[:7] })
	poll.Until(t, 10*time.Second, "n0 learns n1's snapshot", func() bool { return prefixLen(gs[0], "n1", blocks) == kvindex.AnchoredLen(7) })
}

func TestStaleHandling(t *testing.T) {
	gs := startCluster(t, 3, func(i int, c *Config) {
		c.StaleAfter = 300 * time.Millisecond
		switch i {
		case 0:
			c.StalePolicy = FailClosed
		case 1:
			c.StalePolicy = FailOpen
		case 2:
			c.PublishInterval = time.Hour // n2 publishes only when its state changes
		}
	})
	poll.Until(t, 10*time.Second, "3 alive", func() bool { return allAlive(gs, names(gs)...) })
	cases := []struct {
		g             *Gossip
		policy        string
		candidateWhen bool
	}{{gs[0], "closed", false}, {gs[1], "open", true}}
	for _, tc := range cases {
		t.Run(tc.policy, func(t *testing.T) {
			if v := testutil.ToFloat64(tc.g.met.policy.WithLabelValues(tc.policy)); v != 1 {
				t.Fatalf("stale_policy{%s} = %v", tc.policy, v)
			}
			poll.Until(t, 10*time.Second, "n2 stale", func() bool { m, _ := member(tc.g, "n2"); return m.Stale })
			m, _ := member(tc.g, "n2")
			if m.Candidate != tc.candidateWhen || m.Liveness != LivenessAlive {
				t.Fatalf("stale n2 under %s: candidate=%v liveness=%s", tc.policy, m.Candidate, m.Liveness)
			}
			poll.Until(t, 10*time.Second, "stale gauge", func() bool { return testutil.ToFloat64(tc.g.met.stale) >= 1 })
		})
	}
	gs[2].UpdateLocal(State{Running: 9})
	poll.Until(t, 10*time.Second, "n2 fresh again", func() bool {
		for _, g := range gs[:2] {
			m, _ := member(g, "n2")
			if m.Stale || !m.Candidate || m.State.Running != 9 {
				return false
			}
		}
		return true
	})
}

func TestWrongKeyRejected(t *testing.T) {
	gs := startCluster(t, 2, nil)
	poll.Until(t, 10*time.Second, "2 alive", func() bool { return allAlive(gs, names(gs)...) })
	c := testConfig("intruder")
	c.Key = []byte("fedcba9876543210fedcba9876543210")
	bad := startNode(t, c)
	if _, err := bad.ml.Join([]string{gs[0].LocalAddr()}); err == nil {
		t.Fatal("join with the wrong key succeeded")
	}
	// Forged records for n1, sent as n1 would: a new boot id (which would wipe n1's residency)
	// and a delta crediting n1 with blocks it does not hold.
	forged := promptBlocks("forged. ")
	st, _ := AppendState([]byte{wireVersion, msgState}, State{Name: "n1", BootID: 42, Seq: 1 << 40})
	delta, _ := kvindex.Summary{Seq: 1 << 40, Added: forged[:3]}.AppendBinary(deltaHeader("n1", 42))
	to := memberlist.Address{Addr: gs[0].LocalAddr(), Name: "n0"}
	for _, msg := range [][]byte{st, delta} {
		if err := bad.ml.SendToAddress(to, msg); err != nil {
			t.Fatal(err)
		}
	}
	// A legitimate change after the forgery: once it arrived, the forgery had its chance.
	legit := promptBlocks("legit. ")
	gs[1].PrefixStored(legit[:4])
	poll.Until(t, 10*time.Second, "legit delta", func() bool { return prefixLen(gs[0], "n1", legit) == 4 })
	m, _ := member(gs[0], "n1")
	if m.State.BootID != gs[1].bootID || m.Incarnation != 1 || prefixLen(gs[0], "n1", forged) != 0 {
		t.Fatalf("forged state accepted: boot %d incarnation %d", m.State.BootID, m.Incarnation)
	}
	for _, g := range gs {
		if _, ok := member(g, "intruder"); ok {
			t.Fatalf("%s lists the intruder", g.Name())
		}
	}
	if got := len(bad.Members()); got != 1 {
		t.Fatalf("intruder sees %d members", got)
	}
}

func TestMalformedMessagesDropped(t *testing.T) {
	gs := startCluster(t, 2, func(_ int, c *Config) { c.Key, c.Insecure = nil, true })
	poll.Until(t, 10*time.Second, "2 alive", func() bool { return allAlive(gs, names(gs)...) })
	goodDelta, _ := kvindex.Summary{Seq: 1, Added: []uint64{1}}.AppendBinary(deltaHeader("n1", 7))
	futureSummary := slices.Clone(goodDelta)
	futureSummary[len(deltaHeader("n1", 7))] = 9 // summary version 9
	tests := []struct {
		reason string
		msg    []byte
	}{
		{dropMalformed, []byte{wireVersion}},
		{dropVersion, []byte{7, msgState, 1}},
		{dropType, []byte{wireVersion, 99}},
		{dropMalformed, []byte{wireVersion, msgState, 1, tagName, 9}},
		{dropVersion, []byte{wireVersion, msgState, 2, tagName, 1, 'x'}},
		{dropMalformed, goodDelta[:len(goodDelta)-1]},
		{dropVersion, futureSummary},
		{dropUnknownMember, func() []byte {
			b, _ := AppendState([]byte{wireVersion, msgState}, State{Name: "ghost", BootID: 1, Seq: 1})
			return b
		}()},
	}
	var node *memberlist.Node
	for _, n := range gs[1].ml.Members() {
		if n.Name == "n0" {
			node = n
		}
	}
	if node == nil {
		t.Fatal("n1 does not know n0")
	}
	want := map[string]float64{}
	for _, r := range dropReasons {
		want[r] = testutil.ToFloat64(gs[0].met.dropped.WithLabelValues(r))
	}
	for _, tt := range tests {
		want[tt.reason]++
		if err := gs[1].ml.SendReliable(node, tt.msg); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, 10*time.Second, "every malformed message counted", func() bool {
		for _, tt := range tests {
			if testutil.ToFloat64(gs[0].met.dropped.WithLabelValues(tt.reason)) < want[tt.reason] {
				return false
			}
		}
		return true
	})
	if m, _ := member(gs[0], "n1"); m.Liveness != LivenessAlive {
		t.Fatalf("n1 is %s after malformed messages", m.Liveness)
	}
}

func TestLifecycleErrors(t *testing.T) {
	c := testConfig("solo")
	g, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Close(); err != nil {
		t.Fatalf("Close before Start: %v", err)
	}
	if err := g.Start(context.Background()); err != ErrClosed {
		t.Fatalf("Start after Close = %v", err)
	}
	g2 := startNode(t, testConfig("solo2"))
	if err := g2.Start(context.Background()); err != ErrStarted {
		t.Fatalf("second Start = %v", err)
	}
	if err := g2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := g2.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if len(g2.Members()) != 1 {
		t.Fatal("Members unreadable after Close")
	}
}

// TestLeaveNotSentIsNotAnError pins that a departure no peer took within the timeout (nodes
// stopping together) is logged, not returned: the member shuts down cleanly either way.
func TestLeaveNotSentIsNotAnError(t *testing.T) {
	gs := startCluster(t, 2, func(i int, c *Config) {
		// Members meet by push/pull alone; nothing gossips or probes, so the departure stays
		// queued.
		c.GossipInterval, c.ProbeInterval = time.Hour, time.Hour
	})
	poll.Until(t, 10*time.Second, "both members alive in both views", func() bool { return allAlive(gs, "n0", "n1") })
	if err := gs[0].Leave(10 * time.Millisecond); err != nil {
		t.Fatalf("Leave with no peer taking the departure: %v", err)
	}
}

func TestJoinBeforeSeedRetries(t *testing.T) {
	// Reserve a port for the seed by starting and stopping a member on it.
	probe := startNode(t, testConfig("probe"))
	addr := probe.LocalAddr()
	_ = probe.Close()
	c := testConfig("early")
	c.Join = []string{addr}
	early := startNode(t, c)
	sc := testConfig("seed")
	var port int
	if _, err := fmt.Sscanf(addr[len("127.0.0.1:"):], "%d", &port); err != nil {
		t.Fatal(err)
	}
	sc.BindPort = port
	seed := startNode(t, sc)
	poll.Until(t, 10*time.Second, "the early node joins the late seed", func() bool { return allAlive([]*Gossip{early, seed}, "early", "seed") })
}

// TestSeedThatWasOnlyItselfKeepsJoining: a node whose seeds answered with only itself (its own
// address among them, the other not up yet, as two pods behind one headless name can start)
// keeps joining while it is alone, so it finds the other seed once that one starts.
func TestSeedThatWasOnlyItselfKeepsJoining(t *testing.T) {
	reserve := func(name string) (string, int) {
		probe := startNode(t, testConfig(name))
		addr := probe.LocalAddr()
		_ = probe.Close()
		var port int
		if _, err := fmt.Sscanf(addr[len("127.0.0.1:"):], "%d", &port); err != nil {
			t.Fatal(err)
		}
		return addr, port
	}
	addrA, portA := reserve("probe-a")
	addrB, portB := reserve("probe-b")
	ca := testConfig("a")
	ca.BindPort, ca.Join = portA, []string{addrA, addrB}
	a := startNode(t, ca) // its first join reaches itself: a success with no one else
	cb := testConfig("b")
	cb.BindPort = portB
	b := startNode(t, cb)
	poll.Until(t, 10*time.Second, "a joins b, its other seed", func() bool { return allAlive([]*Gossip{a, b}, "a", "b") })
}

// TestPrefixDomainsFollowModels pins that prefix summaries flow only between members serving
// a common model, while membership and state records stay mesh-wide: n0 and n1 serve a, n2
// serves b, n3 serves both and is in both domains.
func TestPrefixDomainsFollowModels(t *testing.T) {
	serves := [][]string{{"a"}, {"a"}, {"b"}, {"a", "b"}}
	var gs []*Gossip
	for i, models := range serves {
		c := testConfig(fmt.Sprintf("n%d", i))
		if i > 0 {
			c.Join = []string{gs[0].LocalAddr()}
		}
		gs = append(gs, startServing(t, c, models...))
	}
	wantDomain := []float64{2, 2, 1, 3}
	poll.Until(t, 10*time.Second, "every record everywhere and the domains built", func() bool {
		if !allAlive(gs, names(gs)...) {
			return false
		}
		for i, g := range gs {
			g.mu.Lock()
			g.rebuildDomainsLocked()
			g.mu.Unlock()
			if testutil.ToFloat64(g.met.domainPeers) != wantDomain[i] {
				return false
			}
		}
		return true
	})
	memberNames := func(ms []Member) []string {
		var out []string
		for _, m := range ms {
			out = append(out, m.Name)
		}
		return out
	}
	if got := memberNames(gs[0].MembersServing(nil, "b")); !slices.Equal(got, []string{"n2", "n3"}) {
		t.Fatalf("n0's members serving b: %v", got)
	}
	if got := memberNames(gs[3].MembersServing(nil, "a")); !slices.Equal(got, []string{"n0", "n1"}) {
		t.Fatalf("n3's members serving a: %v", got)
	}

	text := func(s string) []byte { return []byte(strings.Repeat(s, 64*40/len(s)+1)[:64*40]) }
	onA := kvindex.Blocks("a", text("a prompt of model a. "), 16)
	onB := kvindex.Blocks("b", text("a prompt of model b. "), 16)
	onBoth := kvindex.Blocks("a", text("n3's prompt. "), 16)
	gs[0].PrefixStored(onA)
	gs[2].PrefixStored(onB)
	gs[3].PrefixStored(onBoth)
	poll.Until(t, 10*time.Second, "each prefix across its domains", func() bool {
		return everyoneSees([]*Gossip{gs[1], gs[3]}, "n0", onA, kvindex.AnchoredLen(len(onA))) &&
			everyoneSees([]*Gossip{gs[3]}, "n2", onB, kvindex.AnchoredLen(len(onB))) &&
			everyoneSees(gs[:3], "n3", onBoth, kvindex.AnchoredLen(len(onBoth)))
	})
	// Push/pull pairs members across the whole mesh: once n0's and n2's snapshots have
	// reached the other side of the domain line (and been refused), their deltas had every
	// chance to as well.
	poll.Until(t, 10*time.Second, "snapshots refused across the domain line", func() bool {
		return dropped(gs[0], dropOtherModel) >= 1 && dropped(gs[1], dropOtherModel) >= 1 && dropped(gs[2], dropOtherModel) >= 1
	})
	for _, tc := range []struct {
		g      *Gossip
		origin string
		blocks []uint64
	}{{gs[2], "n0", onA}, {gs[0], "n2", onB}, {gs[1], "n2", onB}} {
		if n := tc.g.idx.PeerBlocks(tc.origin); n != 0 || prefixLen(tc.g, tc.origin, tc.blocks) != 0 {
			t.Errorf("%s holds %d blocks of %s, outside its domains", tc.g.Name(), n, tc.origin)
		}
	}

	// A delta that reaches a member outside its origin's domains anyway (an older node
	// broadcasting to the whole mesh) is refused, not applied or relayed.
	before := dropped(gs[2], dropOtherModel)
	stray, _ := kvindex.Summary{Seq: 1 << 30, Added: onA[:2]}.AppendBinary(deltaHeader("n0", gs[0].bootID))
	if err := gs[0].ml.SendToAddress(memberlist.Address{Addr: gs[2].LocalAddr(), Name: "n2"}, stray); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "n2 refuses n0's stray delta", func() bool { return dropped(gs[2], dropOtherModel) > before })
	if n := gs[2].idx.PeerBlocks("n0"); n != 0 {
		t.Fatalf("n2 applied n0's stray delta: %d blocks", n)
	}
}

// TestNegativeLeaveTimeoutLeavesSilently pins that a member closed with a negative
// LeaveTimeout announces nothing: its peers find it dead, not left.
func TestNegativeLeaveTimeoutLeavesSilently(t *testing.T) {
	gs := startCluster(t, 2, func(i int, c *Config) {
		if i == 1 {
			c.LeaveTimeout = -1
		}
	})
	poll.Until(t, 10*time.Second, "2 alive", func() bool { return allAlive(gs, names(gs)...) })
	if err := gs[1].Close(); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "n1 dead in n0's view", func() bool {
		m, _ := member(gs[0], "n1")
		return m.Liveness != LivenessAlive
	})
	if m, _ := member(gs[0], "n1"); m.Liveness != LivenessDead {
		t.Fatalf("n1 is %s, want dead", m.Liveness)
	}
}

// TestPrefixesGoStraightToTheDomain pins the direct rule over a real mesh: a member's deltas
// reach its domain from it alone (no member sends another's delta), and a member that joins
// later is sent every residency by its owners, with no push/pull to carry it.
func TestPrefixesGoStraightToTheDomain(t *testing.T) {
	var mu sync.Mutex
	relayed := map[string]string{} // sender → an origin of a delta it sent, not itself
	noRelay := func(g *Gossip, msg []byte) bool {
		if origin, _, _, err := decodeDelta(msg[2:]); err == nil && origin != g.Name() {
			mu.Lock()
			relayed[g.Name()] = origin
			mu.Unlock()
		}
		return true
	}
	gs := startClusterVia(t, 3, func(i int, c *Config) { c.PushPullInterval = time.Hour }, noRelay)
	poll.Until(t, 10*time.Second, "3 alive", func() bool { return allAlive(gs, names(gs)...) })
	blocks := promptBlocks("straight to the domain. ")
	gs[0].PrefixStored(blocks)
	poll.Until(t, 10*time.Second, "n0's prefix everywhere", func() bool { return everyoneSees(gs, "n0", blocks, kvindex.AnchoredLen(len(blocks))) })

	c := testConfig("n3")
	c.PushPullInterval = time.Hour
	c.Join = []string{gs[1].LocalAddr()} // memberlist's join exchanges state with n1 only
	late := startNode(t, c)
	poll.Until(t, 10*time.Second, "n0 sends the joiner its residency", func() bool { return prefixLen(late, "n0", blocks) == kvindex.AnchoredLen(len(blocks)) })
	mu.Lock()
	defer mu.Unlock()
	if len(relayed) > 0 {
		t.Fatalf("deltas relayed: %v", relayed)
	}
}

// TestRecordsGoStraightToTheDomain pins records in a mesh whose mesh-wide interval is long:
// a change of load reaches the members of the origin's domain straight away and no other
// member (neither memberlist's gossip nor push/pull runs in the meantime), while the first
// records, structure, went everywhere.
func TestRecordsGoStraightToTheDomain(t *testing.T) {
	serves := [][]string{{"a"}, {"a"}, {"b"}}
	var gs []*Gossip
	for i, models := range serves {
		c := testConfig(fmt.Sprintf("n%d", i))
		c.MeshPublishInterval, c.PushPullInterval = time.Hour, time.Hour
		if i > 0 {
			c.Join = []string{gs[0].LocalAddr()}
		}
		gs = append(gs, startServing(t, c, models...))
	}
	poll.Until(t, 10*time.Second, "every record everywhere", func() bool { return allAlive(gs, names(gs)...) })
	st := State{HTTPAddr: "127.0.0.1:0", EngineHealthy: true, Running: 7, Models: []ModelInfo{{Name: "a", ContextTokens: 8192}}}
	gs[0].UpdateLocal(st)
	poll.Until(t, 10*time.Second, "n1 sees n0's load", func() bool {
		m, _ := member(gs[1], "n0")
		return m.State.Running == 7
	})
	if m, _ := member(gs[2], "n0"); m.State.Running == 7 || m.MaxAge != 3*time.Hour {
		t.Fatalf("n2, outside n0's domain: running %d, max age %v; want the old record, 3h", m.State.Running, m.MaxAge)
	}
}

// TestAdvertiseAddrTakesTheBoundPort: members bound to a fixed port and given an advertise
// address alone (kvmesh node --advertise HOST --gossip HOST:PORT, as deployments run it)
// advertise that port, and so find each other; memberlist on its own advertised port 0.
func TestAdvertiseAddrTakesTheBoundPort(t *testing.T) {
	var gs []*Gossip
	for i := range 2 {
		c := testConfig(fmt.Sprintf("n%d", i))
		c.AdvertiseAddr = "127.0.0.1"
		if i > 0 {
			c.Join = []string{gs[0].LocalAddr()}
		}
		gs = append(gs, startOnFreePort(t, c))
		if got, want := gs[i].LocalAddr(), fmt.Sprintf("127.0.0.1:%d", gs[i].cfg.BindPort); got != want {
			t.Fatalf("n%d advertises %s; want its bound address %s", i, got, want)
		}
	}
	poll.Until(t, 10*time.Second, "both members alive in both views", func() bool { return allAlive(gs, "n0", "n1") })
}

// startOnFreePort starts a member on a fixed port found free (a port 0 bind, closed), again on
// another if something took it in between.
func startOnFreePort(t *testing.T, c Config) *Gossip {
	t.Helper()
	for range 5 {
		l, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		c.BindPort = l.LocalAddr().(*net.UDPAddr).Port
		l.Close()
		g, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		g.UpdateLocal(State{HTTPAddr: "127.0.0.1:0", EngineHealthy: true, Models: []ModelInfo{{Name: "m", ContextTokens: 8192}}})
		if err := g.Start(context.Background()); err != nil {
			if strings.Contains(err.Error(), "address already in use") {
				continue
			}
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = g.Close() })
		return g
	}
	t.Fatal("no free gossip port in five tries")
	return nil
}
