package route

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// The locality rule (locality.go), on a 3,200-token prompt whose 3,072-token shared prefix
// (192 blocks) its home holds, at 20,000 prefill tokens/s and a 20 ms step: a peer without
// the prefix recomputes it (TTFT = (queued + 3200)/20000 + 20 ms), the home does not
// ((queued + 128)/20000 + 20 ms). With a 2 s target and PrefixHomeShare 0.5, a peer meets
// the target at a predicted TTFT of 1 s or less.
func TestLocality(t *testing.T) {
	const prefix = 192
	type peerSpec struct {
		prefix, queued, kvUsed int
	}
	tests := []struct {
		name   string
		cfg    func(*Config)
		target time.Duration
		peers  []peerSpec // n0 is the home
		// wantFirst is the first candidate ("" for none: the request waits in the room);
		// wantOut the peers that must not be candidates at all.
		wantFirst string
		wantOut   []string
		// wantGated are candidates the rule moves behind the others.
		wantGated []string
	}{
		{
			// The home meets the target (626 ms) and the others, loaded too, would take 730
			// ms with their recompute: the home keeps the request, and the others, which would
			// recompute the prefix, are only fallbacks should it refuse or fail.
			name:      "a loaded home keeps the request from loaded peers without the prefix",
			target:    2 * time.Second,
			peers:     []peerSpec{{prefix, 12000, 0}, {0, 11000, 0}, {0, 11000, 0}, {0, 12000, 0}},
			wantFirst: "n0", wantGated: []string{"n1", "n2", "n3"},
		},
		{
			// Against idle peers (180 ms with the recompute) the home's queue costs more than
			// twice what its cache saves: spreading onto idle capacity is cheap, and the load
			// gate decides, as it did.
			name:      "a loaded home against idle peers: the load gate spreads",
			target:    2 * time.Second,
			peers:     []peerSpec{{prefix, 12000, 0}, {0, 0, 0}},
			wantFirst: "n1", wantGated: []string{"n0"},
		},
		{
			// Everyone is loaded and the home is busy (over 16,384 queued tokens): the busy
			// filter dropped it and the request recomputed its prefix on a peer that was
			// merely less loaded (780 ms with its recompute). The home still meets the target
			// (876 ms) and is within the gate: the request waits for it.
			name:      "everyone loaded, the home busy: the request waits for its home",
			target:    2 * time.Second,
			peers:     []peerSpec{{prefix, 17000, 0}, {0, 12000, 0}, {0, 13000, 0}, {0, 16000, 0}},
			wantFirst: "", wantOut: []string{"n1", "n2", "n3"},
		},
		{
			name:      "everyone loaded, the prefix term decides",
			target:    2 * time.Second,
			peers:     []peerSpec{{prefix, 14000, 0}, {0, 11000, 0}, {0, 12000, 0}, {0, 13000, 0}},
			wantFirst: "n0", wantGated: []string{"n1", "n2", "n3"},
		},
		{
			// The home predicts 1,526 ms, past the target's share; the idle peer meets it
			// with its recompute (180 ms): the request leaves.
			name:      "the home misses the target, another meets it with its recompute: it leaves",
			target:    2 * time.Second,
			peers:     []peerSpec{{prefix, 16000 + 14000/2, 0}, {0, 0, 0}},
			wantFirst: "n1", wantGated: []string{"n0"},
		},
		{
			// Queues up to 32,768 tokens are not busy here. The home predicts 1,026 ms; the
			// other peer's queue alone would fit (876 ms), not with the recompute (1,030
			// ms): nobody meets the target, and the load gate keeps the home first.
			name:      "the other meets the target only without its recompute: the home stays first",
			cfg:       func(c *Config) { c.BusyQueuedPrefillTokens = 32768 },
			target:    2 * time.Second,
			peers:     []peerSpec{{prefix, 20000, 0}, {0, 17000, 0}},
			wantFirst: "n0",
		},
		{
			// Queues up to 37,000 tokens are not busy here. Nobody meets the target with the
			// margin; the busy home meets the whole of it (1,926 ms), the other peer only
			// without its recompute (2,025 ms): admission would refuse it for a predicted
			// TTFT that the home's cache beats. The request waits for its home.
			name:      "only a busy home meets the whole target: the request waits for it",
			cfg:       func(c *Config) { c.BusyQueuedPrefillTokens = 37000 },
			target:    2 * time.Second,
			peers:     []peerSpec{{prefix, 38000, 0}, {0, 36900, 0}},
			wantFirst: "", wantOut: []string{"n1"},
		},
		{
			// The home misses the target; a peer holding half the prefix (1,536 tokens, 503
			// ms) and an idle one holding none (180 ms) both meet it. The gate sent it to the
			// faster; the rule sends it where the spill recomputes, and evicts, the least.
			name:      "the spill goes where it recomputes and evicts the least",
			target:    2 * time.Second,
			peers:     []peerSpec{{prefix, 30000, 0}, {prefix / 2, 8000, 0}, {0, 0, 0}},
			wantFirst: "n1", wantGated: []string{"n0"},
		},
		{
			// Everyone loaded: the home predicts 1,026 ms, past the share, and the other meets
			// it with its recompute (980 ms) but sooner by less than the home's cache saves
			// (154 ms plus the gate's 25 ms): a spill there would not relieve the home, only
			// put the prefix on a second node. The home, meeting the whole target, keeps it.
			name:      "a peer barely faster than the loaded home is no second home",
			cfg:       func(c *Config) { c.BusyQueuedPrefillTokens = 32768 },
			target:    2 * time.Second,
			peers:     []peerSpec{{prefix, 20000, 0}, {0, 16000, 0}},
			wantFirst: "n0", wantGated: []string{"n1"},
		},
		{
			// A hot prefix's second home: n1 took the spill before and holds the prefix too.
			// With n0 past the target, n1 (526 ms) keeps the request from n2 (580 ms).
			name:      "a second home takes the spill before a peer without the prefix",
			target:    2 * time.Second,
			peers:     []peerSpec{{prefix, 30000, 0}, {prefix, 10000, 0}, {0, 8000, 0}},
			wantFirst: "n1", wantGated: []string{"n0", "n2"},
		},
		{
			// A home busy by KV keeps the request as a busy home does: it waits in the room for
			// the home's room, routed again each pass with less of its target left, instead of
			// recomputing the prefix on the idle peer and evicting another's there.
			name:      "a home busy by KV: the request waits for its room",
			target:    2 * time.Second,
			peers:     []peerSpec{{prefix, 0, 990}, {0, 0, 0}},
			wantFirst: "", wantOut: []string{"n1"},
		},
		{
			// The same home as the first case, for a request that has waited: 1 s of its
			// target left, 500 ms within the share, and the home predicts 626 ms.
			name:      "a request that waited leaves once its home no longer meets what is left",
			target:    time.Second,
			peers:     []peerSpec{{prefix, 12000, 0}, {0, 0, 0}},
			wantFirst: "n1", wantGated: []string{"n0"},
		},
		{
			name:      "without a target, the load gate decides",
			target:    0,
			peers:     []peerSpec{{prefix, 12000, 0}, {0, 0, 0}},
			wantFirst: "n1", wantGated: []string{"n0"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRouter(t, tt.cfg)
			peers := idlePeers(len(tt.peers))
			for i, s := range tt.peers {
				peers[i].PrefixBlocks, peers[i].QueuedPrefillTokens, peers[i].KVBlocksUsed = s.prefix, s.queued, s.kvUsed
			}
			rq := req(3200)
			rq.TTFTTarget, rq.TPOTTarget = tt.target, 200*time.Millisecond
			c, err := r.Route(t0, rq, peers, nil)
			if tt.wantFirst == "" {
				var nce *NoCandidateError
				if !errors.As(err, &nce) || !nce.Busy() {
					t.Fatalf("want the request to wait (a busy NoCandidateError), got %v: %s", err, Explain(c, 4))
				}
				return
			}
			if err != nil {
				t.Fatalf("Route: %v", err)
			}
			if c[0].Name != tt.wantFirst || c[0].Gated {
				t.Fatalf("first %s, want %s ungated: %s", c[0].Name, tt.wantFirst, Explain(c, 4))
			}
			for _, n := range tt.wantOut {
				if slices.ContainsFunc(c, func(c Candidate) bool { return c.Name == n }) {
					t.Fatalf("%s is a candidate: %s", n, Explain(c, 4))
				}
			}
			for _, cand := range c {
				if slices.Contains(tt.wantGated, cand.Name) != cand.Gated {
					t.Fatalf("%s gated=%v, want gated %v: %s", cand.Name, cand.Gated, tt.wantGated, Explain(c, 4))
				}
			}
		})
	}
}

// TestLocalitySpill: every candidate carries, as its Spill term, the prefix its home holds and
// it does not (what running there recomputes and evicts), the homes none. The others stay
// behind a home that meets the target, gated; with the home busy they are dropped, counted
// busy.
func TestLocalitySpill(t *testing.T) {
	r := newRouter(t, nil)
	peers := idlePeers(3)
	peers[0].PrefixBlocks, peers[0].QueuedPrefillTokens = 192, 30000
	peers[1].PrefixBlocks = 64
	rq := req(3200)
	rq.TTFTTarget = 2 * time.Second
	c := mustRoute(t, r, t0, rq, peers)
	want := map[string]int{"n0": 0, "n1": 3072 - 1024, "n2": 3072}
	for _, cand := range c {
		if cand.Terms.Spill != want[cand.Name] || cand.Home != (cand.Name == "n0") {
			t.Fatalf("%s spill %d home %v, want %d: %s", cand.Name, cand.Terms.Spill, cand.Home, want[cand.Name], Explain(c, 3))
		}
	}
	peers[0].QueuedPrefillTokens = 0
	c = mustRoute(t, r, t0, rq, peers)
	if len(c) != 3 || c[0].Name != "n0" || c[0].Gated || !c[1].Gated || !c[2].Gated {
		t.Fatalf("home meets the target: want n0 first, the others gated behind it: %s", Explain(c, 3))
	}
	peers[0].QueuedPrefillTokens = 17000 // busy, still within the target and the gate
	peers[1].QueuedPrefillTokens, peers[2].QueuedPrefillTokens = 13000, 13000
	before := r.Counts()[ReasonBusy]
	if c, err := r.Route(t0, rq, peers, nil); err == nil || r.Counts()[ReasonBusy]-before != 3 {
		t.Fatalf("busy home: want no candidate and 3 counted busy, got %s, %v and %d", Explain(c, 3), err, r.Counts()[ReasonBusy]-before)
	}
}

// TestLocalityLeavesAgentsAndPlainRouting: the rule does not touch an agent's step (its home
// is its agent's) or a request with no waiting room (KeepBusy).
func TestLocalityLeavesAgentsAndPlainRouting(t *testing.T) {
	peers := idlePeers(2)
	peers[0].PrefixBlocks, peers[0].QueuedPrefillTokens = 192, 12000
	rq := req(3200)
	rq.TTFTTarget = 2 * time.Second
	rq.KeepBusy = true
	if c := mustRoute(t, newRouter(t, nil), t0, rq, peers); len(c) != 2 || c[0].Name != "n1" {
		t.Fatalf("KeepBusy: want both candidates, the gate's order: %s", Explain(c, 2))
	}
	rq.KeepBusy = false
	r := newRouter(t, func(c *Config) { c.PrefixHomeMinTokens = -1 })
	if c := mustRoute(t, r, t0, rq, peers); len(c) != 2 || c[0].Name != "n1" {
		t.Fatalf("PrefixHomeMinTokens -1: want the gate's order: %s", Explain(c, 2))
	}
}

// TestLocalityPastGate: a home keeps the request past the load gate exactly while its decodes,
// beside the prefill queued there (this request's included), stay within the step's TPOT
// target. The prompt and prefix are TestLocality's; a step carries up to 2,048 queued tokens
// (102 ms at 20,000 tokens/s) beside a 20 ms decode step, so a home with a queue predicts a
// SharedTPOT of 122 ms, and one with a 60 ms decode step 162 ms.
func TestLocalityPastGate(t *testing.T) {
	tests := []struct {
		name      string
		step      float64       // the home's decode step, seconds
		queued    int           // the home's queued prefill
		stepTPOT  time.Duration // Request.StepTPOTTarget
		wantFirst string
		wantTPOT  time.Duration // the home's SharedTPOT
	}{
		{
			// The gate would spread (the home's 626 ms against the idle peer's 180 ms), but
			// its decodes keep 122 ms within 150 ms: the prefix decides.
			name: "a loaded home whose decodes keep their target keeps the request from idle peers",
			step: 0.02, queued: 12000, stepTPOT: 150 * time.Millisecond,
			wantFirst: "n0", wantTPOT: 122400 * time.Microsecond,
		},
		{
			// Its decodes would run at 162 ms beside the queue: concentrating the prefix there
			// costs them their target, and the gate spreads.
			name: "a loaded home whose decodes would miss their target: the gate spreads",
			step: 0.06, queued: 12000, stepTPOT: 150 * time.Millisecond,
			wantFirst: "n1", wantTPOT: 162400 * time.Microsecond,
		},
		{
			name: "without a step target the gate decides",
			step: 0.02, queued: 12000, stepTPOT: 0,
			wantFirst: "n1", wantTPOT: 122400 * time.Microsecond,
		},
		{
			// A short queue adds only its own tokens to a step: 128 + 1,000 tokens, 56 ms.
			name: "a short queue adds what it holds, not a full step",
			step: 0.02, queued: 1000, stepTPOT: 150 * time.Millisecond,
			wantFirst: "n0", wantTPOT: 76400 * time.Microsecond,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRouter(t, nil)
			peers := idlePeers(2)
			peers[0].PrefixBlocks, peers[0].QueuedPrefillTokens, peers[0].DecodeStepSeconds = 192, tt.queued, tt.step
			rq := req(3200)
			rq.TTFTTarget, rq.TPOTTarget, rq.StepTPOTTarget = 2*time.Second, 200*time.Millisecond, tt.stepTPOT
			c := mustRoute(t, r, t0, rq, peers)
			if c[0].Name != tt.wantFirst || c[0].Gated {
				t.Fatalf("first %s, want %s ungated: %s", c[0].Name, tt.wantFirst, Explain(c, 2))
			}
			for _, cand := range c {
				if cand.Name == "n0" && cand.SharedTPOT != tt.wantTPOT {
					t.Fatalf("home's SharedTPOT %v, want %v", cand.SharedTPOT, tt.wantTPOT)
				}
			}
		})
	}
}
