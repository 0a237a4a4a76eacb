package route

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// agentRanked returns an agent id whose rendezvous order over names is exactly order.
func agentRanked(t *testing.T, names ...string) string {
	t.Helper()
	for i := range 100000 {
		id := fmt.Sprintf("agent-%d", i)
		if slices.Equal(rendezvousOrder(id, names), names) {
			return id
		}
	}
	t.Fatalf("no agent id ranks %v", names)
	return ""
}

func rendezvousOrder(id string, names []string) []string {
	out := slices.Clone(names)
	slices.SortFunc(out, func(a, b string) int {
		ha, hb := rendezvous(id, a), rendezvous(id, b)
		switch {
		case ha > hb:
			return -1
		case ha < hb:
			return 1
		}
		return 0
	})
	return out
}

func agentReq(id string) Request {
	rq := req(1024)
	rq.Session, rq.StayHome = id, true
	return rq
}

// homeOf routes one step of id and returns its home (the sticky first candidate).
func homeOf(t *testing.T, r *Router, now time.Time, id string, peers []Peer) string {
	t.Helper()
	c := mustRoute(t, r, now, agentReq(id), peers)
	if !c[0].Sticky {
		t.Fatalf("first candidate %s is not the sticky home: %s", c[0].Name, Explain(c, 3))
	}
	return c[0].Name
}

func TestHomeChoice(t *testing.T) {
	id := agentRanked(t, "n0", "n1", "n2") // n0 first, then n1, then n2
	key := AgentKey(id)
	type peerSpec struct {
		agents    int
		keys      []uint64
		prefix    int
		unhealthy bool
		ejected   bool
	}
	tests := []struct {
		name  string
		eps   float64 // HomeBalance
		peers [3]peerSpec
		want  string
	}{
		{"idle mesh: the first by hash", 0, [3]peerSpec{}, "n0"},
		{"first by hash under the bound", 0, [3]peerSpec{{agents: 3}, {agents: 3}, {agents: 3}}, "n0"}, // bound ceil(10/3) = 4
		{"first by hash at the bound: the next", 0, [3]peerSpec{{agents: 4}, {agents: 3}, {agents: 3}}, "n1"},
		{"a larger ε leaves it on the first", 0.25, [3]peerSpec{{agents: 4}, {agents: 3}, {agents: 3}}, "n0"}, // ceil(1.25·11/3) = 5
		{"first two at the bound: the third", 0, [3]peerSpec{{agents: 9}, {agents: 9}, {agents: 0}}, "n2"},
		{"an advertised agent stays, however loaded its home", 0, [3]peerSpec{{}, {}, {agents: 50, keys: []uint64{key}}}, "n2"},
		{"an unhealthy home moves its agents by load", 0, [3]peerSpec{{agents: 9}, {agents: 0}, {agents: 9, keys: []uint64{key}, unhealthy: true}}, "n1"},
		{"an ejected home moves its agents by load", 0, [3]peerSpec{{agents: 9}, {agents: 0}, {agents: 9, keys: []uint64{key}, ejected: true}}, "n1"},
		{"two advertise: the first by hash, whatever the prefixes", 0, [3]peerSpec{{keys: []uint64{key}, prefix: 3}, {keys: []uint64{key}, prefix: 7}, {}}, "n0"},
		{"two advertise: the first by hash of the two", 0, [3]peerSpec{{}, {keys: []uint64{key}, prefix: 2}, {keys: []uint64{key}, prefix: 9}}, "n1"},
		{"a count under the keys counts the keys", 0, [3]peerSpec{{agents: 0, keys: []uint64{1, 2, 3, 4, 5}}, {agents: 3}, {agents: 3}}, "n1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			peers := idlePeers(3)
			for i, s := range tt.peers {
				peers[i].Agents, peers[i].AgentKeys, peers[i].PrefixBlocks = s.agents, s.keys, s.prefix
				peers[i].Healthy, peers[i].Ejected = !s.unhealthy, s.ejected
			}
			for ingress := range 3 { // every ingress (a fresh router each) agrees
				r := newRouter(t, func(c *Config) { c.HomeBalance = tt.eps })
				if got := homeOf(t, r, t0, id, peers); got != tt.want {
					t.Fatalf("ingress %d: home %s, want %s", ingress, got, tt.want)
				}
			}
		})
	}
}

func TestHomePlacementsCount(t *testing.T) {
	t.Run("a burst through one ingress balances before any record", func(t *testing.T) {
		r := newRouter(t, nil)
		peers := idlePeers(2)
		count, plain := map[string]int{}, map[string]int{}
		for i := range 157 {
			id := fmt.Sprintf("burst-%d", i)
			count[homeOf(t, r, t0, id, peers)]++
			plain[rendezvousHome(id, []string{"n0", "n1"})]++
		}
		if max(plain["n0"], plain["n1"]) <= 79 {
			t.Fatalf("the plain hash already splits %v: pick other ids", plain)
		}
		if n := max(count["n0"], count["n1"]); n > 79 {
			t.Fatalf("157 new agents over 2 idle peers: %v (plain hash %v), want at most 79 on one", count, plain)
		}
	})
	t.Run("a placement stops counting once advertised", func(t *testing.T) {
		r := newRouter(t, nil)
		peers := idlePeers(2)
		for i := range 6 {
			homeOf(t, r, t0, fmt.Sprintf("other-%d", i), peers)
		}
		eligible := func(p *Peer) bool { return p.Healthy }
		if l := r.agentLoadsLocked(t0, peers, eligible); l[0]+l[1] != 6 {
			t.Fatalf("loads %v before any record, want the 6 placements", l)
		}
		// The records arrive listing them: loads are what the records say, not twice that.
		for i := range 6 {
			a := fmt.Sprintf("other-%d", i)
			h, _ := r.SessionPeer(a)
			p := &peers[slices.IndexFunc(peers, func(p Peer) bool { return p.Name == h })]
			p.AgentKeys = append(p.AgentKeys, AgentKey(a))
			p.Agents++
		}
		for i := range peers {
			slices.Sort(peers[i].AgentKeys)
		}
		if l := r.agentLoadsLocked(t0, peers, eligible); l[0] != peers[0].Agents || l[1] != peers[1].Agents {
			t.Fatalf("loads %v, want the records' [%d %d]", l, peers[0].Agents, peers[1].Agents)
		}
	})
	t.Run("a placement counts until ReservationTTL", func(t *testing.T) {
		r := newRouter(t, nil)
		peers := idlePeers(2)
		homeOf(t, r, t0, "a", peers)
		eligible := func(p *Peer) bool { return p.Healthy }
		if l := r.agentLoadsLocked(t0.Add(time.Second), peers, eligible); l[0]+l[1] != 1 {
			t.Fatalf("loads %v a second after one placement, want 1 in all", l)
		}
		if l := r.agentLoadsLocked(t0.Add(r.Config().ReservationTTL), peers, eligible); l[0]+l[1] != 0 {
			t.Fatalf("loads %v after ReservationTTL, want none", l)
		}
	})
	t.Run("a new agent routed again before its record stays put", func(t *testing.T) {
		r := newRouter(t, nil)
		id := agentRanked(t, "n0", "n1")
		peers := idlePeers(2)
		if h := homeOf(t, r, t0, id, peers); h != "n0" {
			t.Fatalf("home %s, want n0", h)
		}
		peers[0].Agents = 40 // n0 filled up meanwhile: a new agent would now go to n1
		if h := homeOf(t, r, t0.Add(time.Second), id, peers); h != "n0" {
			t.Fatalf("second step went to %s, want its first home n0", h)
		}
	})
	t.Run("two ingresses before gossip: the second places it anew", func(t *testing.T) {
		// The race the design accepts: ingress A places a new agent, and its next step reaches
		// ingress B before the home's record lists it. B agrees when its view of the loads
		// does; when it does not, the agent is registered at two homes, the next step goes to
		// PreferredHome of the two, and the other releases it once idle.
		id := agentRanked(t, "n0", "n1")
		peers := idlePeers(2)
		a, b := newRouter(t, nil), newRouter(t, nil)
		if ha, hb := homeOf(t, a, t0, id, peers), homeOf(t, b, t0, id, peers); ha != hb {
			t.Fatalf("ingresses with one view disagree: %s and %s", ha, hb)
		}
	})
}

func abs(x int) int { return max(x, -x) }

func TestHomeBalanceValidated(t *testing.T) {
	cfg := DefaultConfig()
	cfg.HomeBalance = -0.1
	if _, err := New(cfg); err == nil {
		t.Fatal("negative HomeBalance accepted")
	}
}

// TestPreferredHome pins that PreferredHome is the advertiser routing sends an agent's steps
// to, whatever order the peers come in, so the home that keeps a twice-registered agent is
// the one its steps reach.
func TestPreferredHome(t *testing.T) {
	r := newRouter(t, nil)
	peers := idlePeers(3)
	for i := range 50 {
		id := fmt.Sprintf("agent-%d", i)
		key := AgentKey(id)
		for _, pair := range [][2]int{{0, 1}, {1, 2}, {0, 2}} {
			for j := range peers {
				peers[j].AgentKeys = nil
			}
			peers[pair[0]].AgentKeys, peers[pair[1]].AgentKeys = []uint64{key}, []uint64{key}
			a, b := peers[pair[0]].Name, peers[pair[1]].Name
			want := PreferredHome(id, []string{a, b})
			if got := PreferredHome(id, []string{b, a}); got != want {
				t.Fatalf("%s: PreferredHome depends on the order: %s and %s", id, want, got)
			}
			if want != a && want != b {
				t.Fatalf("%s: PreferredHome(%s, %s) = %q", id, a, b, want)
			}
			if got := homeOf(t, r, t0, id, peers); got != want {
				t.Fatalf("%s advertised by %s and %s: routed to %s, PreferredHome %s", id, a, b, got, want)
			}
		}
	}
	if got := PreferredHome("a", nil); got != "" {
		t.Fatalf("PreferredHome of no peers = %q", got)
	}
}
