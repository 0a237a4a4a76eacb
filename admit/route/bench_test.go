package route

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/kvindex"
)

// benchPeers builds n varied peers, a third of them carrying reservations.
func benchPeers(b *testing.B, r *Router, n int) []Peer {
	b.Helper()
	peers := idlePeers(n)
	for i := range peers {
		p := &peers[i]
		p.PrefixBlocks = (i * 37) % 129
		p.QueuedPrefillTokens = (i * 997) % 12000
		p.InFlightTokens = (i * 7919) % 60000
		p.KVBlocksUsed = (i * 13) % 800
		p.Running = i % 32
		p.TempC = float64(60 + i%25)
		if i%3 == 0 {
			r.Reserve(t0, p.Name, 512, 40)
		}
	}
	return peers
}

// BenchmarkRoute is one full routing decision (filters, score, gate, tie-break) over n peers,
// prefix lengths given (the kvindex lookup is separate).
func BenchmarkRoute(b *testing.B) {
	for _, n := range []int{8, 64, 1024} {
		b.Run(fmt.Sprintf("peers=%d", n), func(b *testing.B) {
			r := newRouter(b, nil)
			peers := benchPeers(b, r, n)
			dst := make([]Candidate, 0, n)
			rq := req(2048)
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if dst, err = r.Route(t0, rq, peers, dst); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/peer")
		})
	}
}

// BenchmarkRouteWithHashing adds hashing the prompt into chained block hashes
// (kvindex.AppendBlocks, buffer reused) to the decision; the prefix lengths are simulated.
func BenchmarkRouteWithHashing(b *testing.B) {
	for _, tokens := range []int{2048, 32768} {
		for _, n := range []int{8, 64, 1024} {
			b.Run(fmt.Sprintf("tokens=%d/peers=%d", tokens, n), func(b *testing.B) {
				r := newRouter(b, nil)
				peers := benchPeers(b, r, n)
				prompt := []byte(strings.Repeat("abcdefghijklmnopqrstuvwxyz012345", tokens*kvindex.BytesPerToken/32))
				dst := make([]Candidate, 0, n)
				hashes := make([]uint64, 0, tokens/kvindex.DefaultBlockTokens)
				rq := req(tokens)
				b.SetBytes(int64(len(prompt)))
				b.ReportAllocs()
				for b.Loop() {
					hashes = kvindex.AppendBlocks(hashes[:0], rq.Model, prompt, rq.BlockTokens)
					rq.PromptTokens = kvindex.Tokens(len(prompt))
					var err error
					if dst, err = r.Route(t0, rq, peers, dst); err != nil {
						b.Fatal(err)
					}
				}
				if len(hashes) != tokens/kvindex.DefaultBlockTokens {
					b.Fatalf("%d hashes", len(hashes))
				}
			})
		}
	}
}

// BenchmarkRoute1024Peers100Model is one routing decision (filters and score) over a mesh of
// 1,024 peers of which 100 serve the request's model, the others nine other models: the shape
// of a fleet of ten models, given the whole mesh (a node gives only the model's peers, from
// gossip's index by model). Target: 20 µs and 0 allocations.
func BenchmarkRoute1024Peers100Model(b *testing.B) {
	r := newRouter(b, nil)
	peers := benchPeers(b, r, 1024)
	for i := range peers {
		if i%10 != 3 || i >= 1000 {
			peers[i].Models = []string{fmt.Sprintf("model-%d", i%10)}
		}
	}
	rq := req(2048)
	// The first decision grows the router's sort buffers to the mesh, once.
	dst, err := r.Route(t0, rq, peers, make([]Candidate, 0, len(peers)))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if dst, err = r.Route(t0, rq, peers, dst); err != nil {
			b.Fatal(err)
		}
	}
	if len(dst) != 100 {
		b.Fatalf("%d candidates, want the model's 100 peers", len(dst))
	}
}
