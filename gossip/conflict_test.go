package gossip

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/kvindex"
)

func conflictCount(g *Gossip, side string) float64 {
	return testutil.ToFloat64(g.met.conflicts.WithLabelValues(side))
}

// TestNameConflictRules pins, without a network, how records and deltas of a second process
// with a member's name are refused by address, and that no boot id locks a live process out.
func TestNameConflictRules(t *testing.T) {
	g := newUnit(t, nil)
	now := time.Now()
	home := &memberlist.Node{Name: "p", Addr: net.IPv4(10, 0, 0, 1), Port: 7946}
	g.memberEvent(home, LivenessAlive)
	a, b := home.Address(), "10.0.0.2:7946"
	blocks := []uint64{1, 2, 3}
	rec := func(boot, seq uint64, addr string, at time.Time) func() (bool, string) {
		return func() (bool, string) {
			return g.applyState(State{Name: "p", BootID: boot, Seq: seq, GossipAddr: addr}, at)
		}
	}
	delta := func(boot, seq uint64) func() (bool, string) {
		return func() (bool, string) { return g.applyDelta("p", boot, kvindex.Summary{Seq: seq, Added: blocks}) }
	}
	later := now.Add(g.cfg.StaleAfter + time.Millisecond)
	steps := []struct {
		name       string
		apply      func() (bool, string)
		wantReason string
		wantBoot   uint64
		wantState  bool
	}{
		{"the member's record", rec(10, 5, a, now), "", 10, true},
		{"the other process's delta, before its record", delta(20, 1), "", 20, false},
		{"its record, from another address", rec(20, 1, b, now), dropNameConflict, 10, false},
		{"the member's next record", rec(10, 6, a, now), "", 10, true},
		{"the other process's next delta", delta(20, 2), dropNameConflict, 10, true},
		{"its next record", rec(20, 2, b, now), dropNameConflict, 10, true},
		{"a record of an older version, without an address", rec(30, 1, "", now), "", 30, true},
		{"the member's record while that one speaks", rec(10, 7, a, now), dropStaleBoot, 30, true},
		{"the member's record once it went silent", rec(10, 8, a, later), "", 10, true},
	}
	for _, s := range steps {
		_, reason := s.apply()
		m, _ := member(g, "p")
		if reason != s.wantReason || m.State.BootID != s.wantBoot && s.wantState || g.peers["p"].bootID != s.wantBoot || g.peers["p"].hasState != s.wantState {
			t.Fatalf("%s: reason %q boot %d state %v; want %q %d %v", s.name, reason, g.peers["p"].bootID,
				g.peers["p"].hasState, s.wantReason, s.wantBoot, s.wantState)
		}
	}
	if got := conflictCount(g, conflictMember); got != 1 {
		t.Fatalf("conflicts{member} = %v, want 1 (a process refused once, its messages dropped after)", got)
	}

	// memberlist gives the name over to the other address (the member restarted there): that
	// process is the member now.
	g.memberEvent(&memberlist.Node{Name: "p", Addr: home.Addr, Port: home.Port}, LivenessDead)
	g.memberEvent(&memberlist.Node{Name: "p", Addr: net.IPv4(10, 0, 0, 2), Port: 7946}, LivenessAlive)
	if _, reason := rec(20, 3, b, later)(); reason != "" || g.peers["p"].bootID != 20 {
		t.Fatalf("after the address changed hands: reason %q boot %d", reason, g.peers["p"].bootID)
	}

	// Another process's record or notice in this node's own name.
	if _, reason := g.applyState(State{Name: "self", BootID: g.bootID + 2, Seq: 1, GossipAddr: b}, now); reason != dropNameConflict {
		t.Fatalf("a record in this node's name: %q", reason)
	}
	if _, reason := g.applyState(State{Name: "self", BootID: g.bootID + 4, Seq: 1, GossipAddr: g.selfAddr}, now); reason != "" {
		t.Fatalf("a late record of this node's previous process, at its address: %q", reason)
	}
	g.handleMsg(appendConflict([]byte{wireVersion, msgConflict}, "self", g.bootID+2, b))
	g.handleMsg(appendConflict([]byte{wireVersion, msgConflict}, "self", g.bootID, b)) // its own: ignored
	if got := conflictCount(g, conflictSelf); got != 2 {
		t.Fatalf("conflicts{self} = %v, want 2", got)
	}
	g.handleMsg([]byte{wireVersion, msgConflict, 200})
	if dropped(g, dropMalformed) != 1 {
		t.Fatal("a malformed notice not dropped as malformed")
	}
}

// TestNameConflict is the cloned host: a second process with a live member's name. Joining, it
// finds the name taken and refuses to start; the member is told. One that got in anyway
// (joined later, by hand) is refused by every peer: the member keeps its address, its boot
// id and its place in routing, and once the second process is gone, no lockout follows.
func TestNameConflict(t *testing.T) {
	gs := startCluster(t, 3, nil)
	poll.Until(t, 10*time.Second, "3 alive with records", func() bool { return allAlive(gs, names(gs)...) && candidate(gs, "n1", gs[1]) })
	inc := gs[1]
	incAddr := inc.LocalAddr()

	t.Run("a newcomer that finds its name taken refuses to start", func(t *testing.T) {
		c := testConfig("n1")
		c.Join = []string{gs[0].LocalAddr()}
		g, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		err = g.Start(context.Background())
		_ = g.Close()
		if !errors.Is(err, ErrNameConflict) {
			t.Fatalf("Start = %v, want ErrNameConflict", err)
		}
		poll.Until(t, 10*time.Second, "the member told, the seed counting the conflict", func() bool {
			return conflictCount(inc, conflictSelf) >= 1 && conflictCount(gs[0], conflictMember) >= 1
		})
	})

	t.Run("one that got in is refused and leaves no lockout", func(t *testing.T) {
		c := testConfig("n1")
		imp := startNode(t, c) // alone: no seed to find the conflict by
		imp.PrefixStored(promptBlocks("the second process's prefix. "))
		if _, err := imp.ml.Join([]string{gs[0].LocalAddr(), gs[2].LocalAddr()}); err != nil {
			t.Fatal(err)
		}
		peers := []*Gossip{gs[0], gs[2]}
		// Its records reach each peer (straight, by domain, and by push/pull) and are refused,
		// several times; through it all n1 stays at its address.
		poll.Until(t, 10*time.Second, "the second process's records refused by both peers", func() bool {
			for _, g := range peers {
				if m, _ := member(g, "n1"); m.Addr != incAddr {
					t.Fatalf("%s holds n1 at %s, not %s", g.Name(), m.Addr, incAddr)
				}
				if dropped(g, dropNameConflict) < 3 {
					return false
				}
			}
			return true
		})
		poll.Until(t, 10*time.Second, "n1 a candidate with its own process", func() bool { return candidate(peers, "n1", inc) })
		kill(imp)
		poll.Until(t, 5*time.Second, "n1 a candidate with its own process once the other is gone", func() bool {
			return candidate(peers, "n1", inc)
		})
	})
}

// candidate says whether every one of gs holds name a routing candidate at want's address,
// with want's boot id.
func candidate(gs []*Gossip, name string, want *Gossip) bool {
	for _, g := range gs {
		if g == want {
			continue
		}
		m, _ := member(g, name)
		if !m.Candidate || m.Addr != want.LocalAddr() || m.State.BootID != want.bootID {
			return false
		}
	}
	return true
}
