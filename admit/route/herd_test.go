package route

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// dispatch routes rq and reserves on the first candidate as the node does, marking the
// chosen peer as holding the prompt's prefix (the ingress's speculative index update).
func dispatch(t *testing.T, p Policy, now time.Time, rq Request, peers []Peer, prefixBlocks int) string {
	t.Helper()
	c := mustRoute(t, p, now, rq, peers)[0]
	p.Reserve(now, c.Name, rq.PromptTokens-c.Terms.PrefixTokens, rq.PromptTokens/16+8)
	peers[c.Peer].PrefixBlocks = max(peers[c.Peer].PrefixBlocks, prefixBlocks)
	return c.Name
}

// Known failure modes (REFERENCE.md): dispatch outruns gossip, and burst siblings see no
// overlap until the first updates arrive. 50 requests in one millisecond, no state record in
// between, must spread over 8 idle peers.
func TestBurstSpreadsBeforeGossip(t *testing.T) {
	tests := []struct {
		name         string
		holderBlocks int // blocks of the shared prefix n0 holds at the start
		spec         int // blocks marked on the chosen peer after each dispatch
	}{
		{"no shared prefix", 0, 0},
		{"shared system prompt held by one peer", 96, 96},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRouter(t, nil)
			peers := idlePeers(8)
			for i := range peers {
				peers[i].KVBlocksTotal = 4000 // the burst fits: spreading, not KV, is on test
			}
			peers[0].PrefixBlocks = tt.holderBlocks
			got := map[string]int{}
			for i := range 50 {
				now := t0.Add(time.Duration(i) * time.Microsecond * 20)
				got[dispatch(t, r, now, req(2048), peers, tt.spec)]++
			}
			t.Logf("burst split: %v", got)
			// An even split is 6.25 each. Reservations make it near even; picks blind to
			// them (random among equals) would scatter far wider.
			if v := mapValues(got); len(v) != 8 || slices.Max(v) > 8 || slices.Min(v) < 5 {
				t.Fatalf("burst landed %v: want every peer 5–8", got)
			}
		})
	}
}

// Known failure mode: a node holding the prefix keeps attracting traffic while overloaded.
func TestOverloadedPrefixHolderStopsAttracting(t *testing.T) {
	tests := []struct {
		name   string
		mod    func(*Peer)
		reason string
	}{
		{"queue over busy threshold", func(p *Peer) { p.QueuedPrefillTokens = 20000 }, "busy"},
		{"kv over busy threshold", func(p *Peer) { p.KVBlocksUsed = 950 }, "busy"},
		{"queue under threshold but slower than its cache saves", func(p *Peer) { p.QueuedPrefillTokens = 12000 }, "gated"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRouter(t, nil)
			peers := idlePeers(4)
			peers[0].PrefixBlocks = 128 // the whole 2048-token prompt
			tt.mod(&peers[0])
			for i := range 20 {
				now := t0.Add(time.Duration(i) * time.Millisecond)
				c := mustRoute(t, r, now, req(2048), peers)
				if c[0].Name == "n0" {
					t.Fatalf("request %d went to the overloaded prefix holder: %s", i, Explain(c, 4))
				}
				i := slices.IndexFunc(c, func(c Candidate) bool { return c.Name == "n0" })
				if (tt.reason == "busy") != (i < 0) || (i >= 0 && !c[i].Gated) {
					t.Fatalf("holder should be %s: %s", tt.reason, Explain(c, 4))
				}
			}
		})
	}
}

// Known failure mode: on a cache miss, picking without regard to load (or the smallest index)
// sent all new traffic to an overloaded worker.
func TestCacheMissGoesToLeastLoaded(t *testing.T) {
	inflight := []int{30000, 20000, 500, 10000}
	for seed := range uint64(20) {
		r := newRouter(t, func(c *Config) { c.Seed = seed })
		peers := idlePeers(4)
		for i, n := range inflight {
			peers[i].InFlightTokens = n
		}
		c := mustRoute(t, r, t0, req(2048), peers)
		if got := names(c); !slices.Equal(got, []string{"n2", "n3", "n1", "n0"}) {
			t.Fatalf("seed %d: order %v, want least loaded first", seed, got)
		}
	}
}

// Known failure mode: the prefix weight outweighs the load weights so no gate can move
// traffic. The gate reads only predicted TTFT, so no weights can stop it.
func TestPrefixWeightCannotDisableGate(t *testing.T) {
	weights := []Weights{
		DefaultConfig().Weights,
		only(Weights{Prefix: 1e12}),
		only(Weights{Prefix: 1e300, Thermal: 1e300}),
		only(Weights{Prefix: 1e6, FreeKV: 1e6, Power: 1e6}),
		only(Weights{}),
	}
	for _, w := range weights {
		t.Run(fmt.Sprintf("%+v", w), func(t *testing.T) {
			r := newRouter(t, func(c *Config) { c.Weights = w })
			peers := idlePeers(3)
			peers[0].PrefixBlocks = 128
			peers[0].QueuedPrefillTokens = 15000 // under the busy threshold
			peers[1].QueuedPrefillTokens = 2000
			c := mustRoute(t, r, t0, req(2048), peers)
			if c[0].Name == "n0" || c[0].Gated || !c[len(c)-1].Gated || c[len(c)-1].Name != "n0" {
				t.Fatalf("gate did not move traffic: %s", Explain(c, 3))
			}
		})
	}
}

func TestTieBreak(t *testing.T) {
	firsts := func(r *Router, peers []Peer, n int) []string {
		out := make([]string, n)
		for i := range out {
			c, err := r.Route(t0, req(100), peers, nil)
			if err != nil {
				t.Fatal(err)
			}
			out[i] = c[0].Name
		}
		return out
	}
	t.Run("deterministic under seed", func(t *testing.T) {
		peers := idlePeers(8)
		a := firsts(newRouter(t, func(c *Config) { c.Seed = 42 }), peers, 100)
		b := firsts(newRouter(t, func(c *Config) { c.Seed = 42 }), peers, 100)
		d := firsts(newRouter(t, func(c *Config) { c.Seed = 43 }), peers, 100)
		if !slices.Equal(a, b) {
			t.Fatal("same seed gave different picks")
		}
		if slices.Equal(a, d) {
			t.Fatal("different seeds gave identical picks")
		}
	})
	t.Run("equal peers share evenly", func(t *testing.T) {
		got := map[string]int{}
		for _, n := range firsts(newRouter(t, nil), idlePeers(4), 400) {
			got[n]++
		}
		for _, p := range idlePeers(4) {
			if got[p.Name] < 50 {
				t.Fatalf("picks %v: %s starved", got, p.Name)
			}
		}
	})
	t.Run("outside epsilon never first", func(t *testing.T) {
		peers := idlePeers(3)
		peers[2].InFlightTokens = 2000 // load term 0.5×0.109 ≈ 0.054 below the others
		got := map[string]int{}
		for _, n := range firsts(newRouter(t, nil), peers, 200) {
			got[n]++
		}
		if got["n2"] != 0 || got["n0"] == 0 || got["n1"] == 0 {
			t.Fatalf("picks %v: want n0 and n1 only", got)
		}
	})
	t.Run("two choices prefer lower load", func(t *testing.T) {
		peers := idlePeers(3)
		peers[0].InFlightTokens = 300
		peers[1].InFlightTokens = 200
		peers[2].InFlightTokens = 100
		got := map[string]int{}
		for _, n := range firsts(newRouter(t, func(c *Config) { c.Epsilon = 1 }), peers, 300) {
			got[n]++
		}
		// The most loaded of three never wins a pair; the least loaded wins two pairs of three.
		if got["n0"] != 0 || got["n2"] < 150 || got["n1"] == 0 {
			t.Fatalf("picks %v", got)
		}
	})
}

func TestSessionStickiness(t *testing.T) {
	t.Run("sticks while within the gate, moves when gated", func(t *testing.T) {
		r := newRouter(t, nil)
		peers := idlePeers(4)
		rq := req(2048)
		rq.Session = "agent-1"
		first := mustRoute(t, r, t0, rq, peers)[0].Name
		i := slices.IndexFunc(peers, func(p Peer) bool { return p.Name == first })
		peers[i].InFlightTokens = 3000 // a little worse: the tie-break alone would move away
		for range 20 {
			c := mustRoute(t, r, t0, rq, peers)
			if c[0].Name != first || !c[0].Sticky {
				t.Fatalf("session left %s while within the gate: %s", first, Explain(c, 4))
			}
		}
		peers[i].QueuedPrefillTokens = 12000
		c := mustRoute(t, r, t0, rq, peers)
		if c[0].Name == first || c[0].Sticky {
			t.Fatalf("session stayed on gated %s: %s", first, Explain(c, 4))
		}
		if p, _ := r.SessionPeer("agent-1"); p != c[0].Name {
			t.Fatalf("session recorded %q, want %q", p, c[0].Name)
		}
	})
	t.Run("StayHome keeps a busy or gated home first", func(t *testing.T) {
		peers := idlePeers(3)
		for i := range peers {
			peers[i].PrefixBlocks = 10 * (i + 1) // the longest prefix does not decide the home
		}
		rq := req(2048)
		rq.Session, rq.StayHome = "agent-7", true
		home := rendezvousHome("agent-7", []string{"n0", "n1", "n2"})
		i := slices.IndexFunc(peers, func(p Peer) bool { return p.Name == home })
		peers[i].QueuedPrefillTokens = 1 << 20 // busy and gated
		for range 3 {                          // every ingress (a fresh router each) agrees
			c := mustRoute(t, newRouter(t, nil), t0, rq, peers)
			if c[0].Name != home || !c[0].Sticky || c[0].Gated {
				t.Fatalf("first %s, want home %s first, sticky and not gated: %s", c[0].Name, home, Explain(c, 3))
			}
		}
		rq.StayHome = false
		if c := mustRoute(t, newRouter(t, nil), t0, rq, peers); slices.ContainsFunc(c, func(c Candidate) bool { return c.Name == home }) {
			t.Fatalf("without StayHome the busy %s is still a candidate: %s", home, Explain(c, 3))
		}
		peers[i].Healthy = false // the home left: the next peer by hash takes over
		rq.StayHome = true
		c := mustRoute(t, newRouter(t, nil), t0, rq, peers)
		if c[0].Name == home || !c[0].Sticky {
			t.Fatalf("unhealthy home %s still first: %s", home, Explain(c, 3))
		}
	})
	t.Run("new agents spread over the homes", func(t *testing.T) {
		count := map[string]int{}
		for i := range 1000 {
			count[rendezvousHome(fmt.Sprintf("agent-1-%d", i), []string{"n1", "n2", "n3"})]++
		}
		for _, p := range []string{"n1", "n2", "n3"} {
			if count[p] < 250 || count[p] > 420 {
				t.Fatalf("1000 new agents over 3 peers: %v, want about a third each", count)
			}
		}
	})
	t.Run("Stick overrides", func(t *testing.T) {
		r := newRouter(t, nil)
		rq := req(100)
		rq.Session = "s"
		r.Stick("s", "n3")
		if c := mustRoute(t, r, t0, rq, idlePeers(4)); c[0].Name != "n3" {
			t.Fatalf("first %s, want stuck n3", c[0].Name)
		}
	})
	t.Run("bounded LRU", func(t *testing.T) {
		r := newRouter(t, func(c *Config) { c.MaxSessions = 2 })
		r.Stick("a", "n0")
		r.Stick("b", "n1")
		r.Stick("a", "n2") // touch a: b is now oldest
		r.Stick("c", "n3")
		if _, ok := r.SessionPeer("b"); ok {
			t.Fatal("oldest session b not evicted")
		}
		if p, _ := r.SessionPeer("a"); p != "n2" {
			t.Fatalf("a → %q, want n2", p)
		}
		if p, _ := r.SessionPeer("c"); p != "n3" {
			t.Fatalf("c → %q, want n3", p)
		}
	})
}

func TestPolicies(t *testing.T) {
	newP := func(t *testing.T, name string, seed uint64) Policy {
		t.Helper()
		cfg := DefaultConfig()
		cfg.Seed = seed
		p, err := NewPolicy(name, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if p.Name() != name {
			t.Fatalf("Name %q, want %q", p.Name(), name)
		}
		return p
	}
	// n0 holds the whole prompt but is far over the busy threshold, n1 has the fewest
	// requests but the most token load, n2 is the least token-loaded; x serves another model.
	scenario := func() []Peer {
		ps := idlePeers(3)
		ps[0].PrefixBlocks, ps[0].QueuedPrefillTokens, ps[0].Running = 128, 30000, 5
		ps[1].Running, ps[1].InFlightTokens = 1, 15000
		ps[2].Running, ps[2].InFlightTokens = 3, 1000
		x := idle("x")
		x.Models = []string{"other"}
		return append(ps, x)
	}
	tests := []struct {
		name   string
		prompt int
		mod    func([]Peer)
		want   []string // first candidate of successive routes
	}{
		{name: PolicyKvmesh, prompt: 2048, want: []string{"n2", "n2"}},
		{name: PolicyRoundRobin, prompt: 2048, want: []string{"n0", "n1", "n2", "n0", "n1", "n2"}},
		{name: PolicyLeastLoad, prompt: 2048, want: []string{"n1", "n1"}},
		{name: PolicyCacheAware, prompt: 2048, want: []string{"n0", "n0"}},
		{name: PolicyCacheAware + " under threshold", prompt: 2048, mod: func(ps []Peer) { ps[0].PrefixBlocks = 32 }, want: []string{"n1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name, _, _ := cut(tt.name)
			p := newP(t, name, 1)
			peers := scenario()
			if tt.mod != nil {
				tt.mod(peers)
			}
			for i, w := range tt.want {
				c := mustRoute(t, p, t0, req(tt.prompt), peers)
				if c[0].Name != w {
					t.Fatalf("route %d: first %s, want %s (%s)", i, c[0].Name, w, Explain(c, 4))
				}
				if slices.Contains(names(c), "x") {
					t.Fatal("peer without the model was a candidate")
				}
			}
		})
	}
	t.Run(PolicyRandom, func(t *testing.T) {
		seq := func(seed uint64) []string {
			p := newP(t, PolicyRandom, seed)
			var out []string
			for range 300 {
				out = append(out, mustRoute(t, p, t0, req(10), scenario())[0].Name)
			}
			return out
		}
		a, b := seq(7), seq(7)
		if !slices.Equal(a, b) {
			t.Fatal("random is not deterministic under its seed")
		}
		for _, n := range []string{"n0", "n1", "n2"} {
			if c := countOf(a, n); c < 50 {
				t.Fatalf("random picked %s %d times of 300", n, c)
			}
		}
	})
	t.Run("cache-aware herds a burst, kvmesh spreads it", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			most int // bound on the busiest peer's share of 40
			herd bool
		}{{PolicyCacheAware, 40, true}, {PolicyKvmesh, 8, false}} {
			p := newP(t, tc.name, 1)
			peers := idlePeers(8)
			peers[0].PrefixBlocks = 96
			got := map[string]int{}
			for range 40 {
				got[dispatch(t, p, t0, req(2048), peers, 0)]++
			}
			t.Logf("%s: %v", tc.name, got)
			if tc.herd && got["n0"] != 40 {
				t.Fatalf("%s: %v, expected the whole burst on the prefix holder", tc.name, got)
			}
			if !tc.herd && slices.Max(mapValues(got)) > tc.most {
				t.Fatalf("%s: %v herded", tc.name, got)
			}
		}
	})
	t.Run("no host", func(t *testing.T) {
		for _, name := range PolicyNames {
			_, err := newP(t, name, 1).Route(t0, Request{Model: "absent", PromptTokens: 1}, scenario(), nil)
			nc, ok := err.(*NoCandidateError)
			if !ok || !nc.NoHost() {
				t.Fatalf("%s: err %v, want NoHost", name, err)
			}
		}
	})
	t.Run("every policy drops ejected peers", func(t *testing.T) {
		for _, name := range PolicyNames {
			p := newP(t, name, 1)
			peers := scenario()
			peers[0].Ejected, peers[1].Ejected = true, true
			for range 4 {
				if got := names(mustRoute(t, p, t0, req(2048), peers)); !slices.Equal(got, []string{"n2"}) {
					t.Fatalf("%s: candidates %v, want [n2]", name, got)
				}
			}
			peers[2].Ejected = true
			_, err := p.Route(t0, req(2048), peers, nil)
			if nc, ok := err.(*NoCandidateError); !ok || !nc.Busy() || nc.Counts[ReasonEjected] != 3 {
				t.Fatalf("%s: every host ejected: err %v, want Busy with ejected=3", name, err)
			}
		}
	})
	t.Run("unknown policy", func(t *testing.T) {
		if _, err := NewPolicy("fastest", DefaultConfig()); err == nil {
			t.Fatal("unknown policy accepted")
		}
	})
	t.Run("baselines keep no reservations", func(t *testing.T) {
		p := newP(t, PolicyLeastLoad, 1)
		res := p.Reserve(t0, "n0", 100, 1)
		if p.Release(res) {
			t.Fatal("baseline released a reservation it should not hold")
		}
	})
}

func cut(s string) (string, string, bool) {
	for i := range s {
		if s[i] == ' ' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

func countOf(xs []string, x string) int {
	n := 0
	for _, v := range xs {
		if v == x {
			n++
		}
	}
	return n
}

func mapValues(m map[string]int) []int {
	out := make([]int, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// rendezvousHome is the home Route gives a new agent among peers named names.
func rendezvousHome(session string, names []string) string {
	best, home := uint64(0), ""
	for _, n := range names {
		if h := rendezvous(session, n); home == "" || h > best {
			best, home = h, n
		}
	}
	return home
}
