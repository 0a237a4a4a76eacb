package kvindex

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
)

const benchPromptTokens = 32 * 1024

func benchPrompt() []byte {
	r := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, benchPromptTokens*BytesPerToken)
	for i := range b {
		b[i] = byte('a' + r.IntN(26))
	}
	return b
}

// BenchmarkBlocks hashes a 32k-token prompt (128 KiB) into chained block hashes.
func BenchmarkBlocks(b *testing.B) {
	p := benchPrompt()
	dst := make([]uint64, 0, len(p)/(DefaultBlockTokens*BytesPerToken))
	b.SetBytes(int64(len(p)))
	b.ResetTimer()
	for b.Loop() {
		dst = AppendBlocks(dst[:0], "llama-3.1-8b", p, DefaultBlockTokens)
	}
	b.ReportMetric(float64(b.N)*float64(len(p))/b.Elapsed().Seconds()/1e9, "GB/s")
}

// BenchmarkRawXXHash hashes the same bytes in one xxhash pass: the ceiling for BenchmarkBlocks.
func BenchmarkRawXXHash(b *testing.B) {
	p := benchPrompt()
	b.SetBytes(int64(len(p)))
	var sink uint64
	for b.Loop() {
		sink += xxhash.Sum64(p)
	}
	b.ReportMetric(float64(b.N)*float64(len(p))/b.Elapsed().Seconds()/1e9, "GB/s")
	_ = sink
}

// BenchmarkLongestPrefix scores a 32k-token prompt (2048 blocks) against 64 and 1,024 peers:
// a quarter hold long prefixes of it (up to all of it), a quarter short ones, and the rest
// only unrelated blocks.
func BenchmarkLongestPrefix(b *testing.B) {
	req := Blocks("llama-3.1-8b", benchPrompt(), DefaultBlockTokens)
	for _, peers := range []int{64, 1024} {
		b.Run(fmt.Sprintf("peers=%d", peers), func(b *testing.B) {
			x := NewIndex(IndexConfig{})
			r := rand.New(rand.NewPCG(3, 4))
			unrelated := make([]uint64, 2048)
			for p := 0; p < peers; p++ {
				for i := range unrelated {
					unrelated[i] = r.Uint64()
				}
				name := fmt.Sprintf("node-%04d", p)
				x.Add(name, unrelated)
				switch p % 4 {
				case 0:
					x.Add(name, req[:len(req)/2+r.IntN(len(req)/2+1)])
				case 1:
					x.Add(name, req[:1+r.IntN(64)])
				}
			}
			now := time.Unix(0, 0)
			dst := x.LongestPrefix(req, now, nil)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				dst = x.LongestPrefix(req, now, dst[:0])
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/lookup")
			if len(dst) != peers/2 {
				b.Fatalf("%d matches, want %d", len(dst), peers/2)
			}
		})
	}
}

// BenchmarkIndexMemory measures the heap one confirmed (peer, block) entry costs, with no
// block shared (each entry its own hash) and with every block held by 40 peers: the figures
// behind EntryBytes and DistinctBytes (entry = EntryBytes + DistinctBytes/holders).
func BenchmarkIndexMemory(b *testing.B) {
	for _, holders := range []int{1, 40} {
		b.Run(fmt.Sprintf("holders=%d", holders), func(b *testing.B) {
			const peers, blocks = 40, 20000
			var perEntry float64
			for b.Loop() {
				var ms0, ms1 runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&ms0)
				x := NewIndex(IndexConfig{})
				hs := make([]uint64, blocks)
				for p := range peers {
					for i := range hs {
						hs[i] = uint64((p/holders)*blocks+i) * 0x9e3779b97f4a7c15
					}
					x.Add(fmt.Sprintf("p%d", p), hs)
				}
				runtime.GC()
				runtime.ReadMemStats(&ms1)
				perEntry = float64(ms1.HeapAlloc-ms0.HeapAlloc) / (peers * blocks)
				runtime.KeepAlive(x)
			}
			b.ReportMetric(perEntry, "B/entry")
		})
	}
}
