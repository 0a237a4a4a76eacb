package gossip

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/poll"
)

// BenchmarkPropagation measures the time from PrefixStored on one node to every other node's
// index holding the prefix, over deltas only (push/pull is pushed out of the way).
func BenchmarkPropagation(b *testing.B) {
	for _, n := range []int{5} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			var gs []*Gossip
			for i := 0; i < n; i++ {
				c := testConfig(fmt.Sprintf("b%d", i))
				c.PushPullInterval = time.Hour
				if i > 0 {
					c.Join = []string{gs[0].LocalAddr()}
				}
				gs = append(gs, startServing(b, c, "m"))
			}
			poll.Until(b, 10*time.Second, "the cluster to converge", func() bool { return allAlive(gs, names(gs)...) })
			var lat []time.Duration
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				blocks := []uint64{uint64(i)<<20 | 1, uint64(i)<<20 | 2}
				start := time.Now()
				gs[0].PrefixStored(blocks)
				for !everyoneSees(gs[1:], "b0", blocks, 2) {
					if time.Since(start) > 10*time.Second {
						b.Fatal("prefix did not propagate")
					}
					time.Sleep(time.Millisecond) // polling at the resolution the latency is measured to
				}
				lat = append(lat, time.Since(start))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1e3, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1e3, "p99-ms")
		})
	}
}
