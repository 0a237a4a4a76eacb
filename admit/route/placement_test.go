package route

import (
	"slices"
	"testing"
	"time"
)

// coldReq is a 3,200-token prompt (200 blocks of 16) whose head hashes under key, with a 2 s
// TTFT target: a peer meets the locality margin at a predicted TTFT of 1 s or less.
func coldReq(key uint64) Request {
	rq := req(3200)
	rq.Blocks = make([]uint64, 200)
	for i := range rq.Blocks {
		rq.Blocks[i] = key + uint64(i)<<32
	}
	rq.TTFTTarget, rq.TPOTTarget = 2*time.Second, 200*time.Millisecond
	return rq
}

// order is the peers' names in key's rendezvous order (highest hash first).
func order(key uint64, peers []Peer) []string {
	out := make([]string, len(peers))
	for i := range peers {
		out[i] = peers[i].Name
	}
	slices.SortFunc(out, func(a, b string) int {
		if before(rendezvousKey(key, a), a, rendezvousKey(key, b), b) {
			return -1
		}
		return 1
	})
	return out
}

// TestColdPlacement: a prompt whose prefix no peer holds goes to the first peer in its
// head's rendezvous order that would keep it as a home does, whatever ingress routes it and
// whatever the tie-break draws; the others stay behind it, gated. The key is the block that
// holds the home minimum's last token (block 63 of 16 tokens: 1,024 tokens).
func TestColdPlacement(t *testing.T) {
	const key = 0x5eed
	rq := coldReq(key)
	peers := idlePeers(4)
	want := order(rq.Blocks[63], peers)
	loadFirst := func(ps []Peer, tokens int) {
		ps[slices.IndexFunc(ps, func(p Peer) bool { return p.Name == want[0] })].QueuedPrefillTokens = tokens
	}
	tests := []struct {
		name string
		busy int // Config.BusyQueuedPrefillTokens
		set  func(rq *Request, ps []Peer)
		want string // "": the load gate decides, as without the rule
	}{
		{
			name: "equal idle peers: the first in the head's order, from every ingress",
			busy: 32768,
			want: want[0],
		},
		{
			// Loaded by 8,000 queued tokens (580 ms with the recompute, within the margin)
			// against idle peers, its shared TPOT (20 ms step + 102 ms of a 2,048-token chunk)
			// past the 100 ms step target: the gate spreads as for a home.
			name: "the first peer loaded past the gate and its decodes' TPOT: the next in the order",
			set: func(rq *Request, ps []Peer) {
				rq.StepTPOTTarget = 100 * time.Millisecond
				loadFirst(ps, 8000)
			},
			busy: 32768,
			want: want[1],
		},
		{
			// The same queue with decodes that keep their TPOT beside it: it keeps the
			// request, as a home past the gate does.
			name: "the first peer loaded past the gate, its decodes within their TPOT: it keeps it",
			set: func(rq *Request, ps []Peer) {
				rq.StepTPOTTarget = 200 * time.Millisecond
				loadFirst(ps, 8000)
			},
			busy: 32768,
			want: want[0],
		},
		{
			// 30,000 queued tokens (1.68 s) miss the margin; it is not busy (the threshold
			// raised), so only the margin moves the prefix on.
			name: "the first peer past the margin: the next in the order",
			set: func(rq *Request, ps []Peer) {
				rq.StepTPOTTarget = time.Second
				loadFirst(ps, 30000)
			},
			busy: 32768,
			want: want[1],
		},
		{
			// Busy by its queue: no candidate, so the next peer in the order takes it.
			name: "the first peer busy: the next in the order",
			set: func(rq *Request, ps []Peer) {
				loadFirst(ps, 40000)
			},
			busy: 16384,
			want: want[1],
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Four ingresses, each its own tie-break draws, route the same request.
			for seed := uint64(1); seed <= 4; seed++ {
				r := newRouter(t, func(c *Config) { c.Seed, c.BusyQueuedPrefillTokens = seed, tt.busy })
				rq, ps := coldReq(key), idlePeers(4)
				if tt.set != nil {
					tt.set(&rq, ps)
				}
				c := mustRoute(t, r, t0, rq, ps)
				if c[0].Name != tt.want || c[0].Gated {
					t.Fatalf("ingress %d: first %s, want %s ungated (order %v): %s", seed, c[0].Name, tt.want, want, Explain(c, 4))
				}
				for _, o := range c[1:] {
					if !o.Gated {
						t.Fatalf("ingress %d: %s not gated behind the cold prefix's place: %s", seed, o.Name, Explain(c, 4))
					}
				}
			}
		})
	}
}

// TestColdKey: the key is the block holding the home minimum's last token, in the request's
// tokens (TokenScale), or the last block of a shorter chain; a prompt shorter than the home
// minimum, or without blocks, has none (it is placed by load).
func TestColdKey(t *testing.T) {
	cfg := DefaultConfig() // PrefixHomeMinTokens 1024
	blocks := make([]uint64, 200)
	for i := range blocks {
		blocks[i] = uint64(i + 1)
	}
	tests := []struct {
		name   string
		prompt int
		scale  float64
		blocks []uint64
		want   uint64 // 0: none
	}{
		{name: "16-token blocks: block 64 holds token 1,024", prompt: 3200, blocks: blocks, want: 64},
		{name: "a block holds 32 of the request's tokens", prompt: 3200, scale: 2, blocks: blocks, want: 32},
		{name: "a chain shorter than the minimum's block: its last", prompt: 3200, blocks: blocks[:10], want: 10},
		{name: "a prompt under the home minimum: none", prompt: 1000, blocks: blocks},
		{name: "no blocks: none", prompt: 3200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rq := req(tt.prompt)
			rq.TokenScale, rq.Blocks = tt.scale, tt.blocks
			key, ok := coldKey(&cfg, rq)
			if ok != (tt.want != 0) || key != tt.want {
				t.Fatalf("coldKey = %d, %v; want %d", key, ok, tt.want)
			}
		})
	}
}

// TestColdPlacementSpreads: cold prefixes of many heads spread over equal peers, each peer
// the place of some (the hash is not biased to a name).
func TestColdPlacementSpreads(t *testing.T) {
	r := newRouter(t, nil)
	peers := idlePeers(4)
	got := map[string]int{}
	for k := uint64(1); k <= 200; k++ {
		c := mustRoute(t, r, t0, coldReq(k*0x9e3779b97f4a7c15), peers)
		got[c[0].Name]++
	}
	for _, p := range peers {
		if got[p.Name] < 30 || got[p.Name] > 70 {
			t.Fatalf("200 cold prefixes over 4 equal peers: %v, want each 30-70", got)
		}
	}
}
