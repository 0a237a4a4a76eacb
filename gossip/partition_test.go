package gossip

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/kvindex"
)

// TestPartitionHeals pins that a partition long enough for each side to declare the other
// dead heals with the network: each member keeps trying to join the members it holds dead
// (memberlist alone never speaks to them again), and the prefixes each side stored meanwhile
// reach the other. Config.Drop makes the partition: {n0, n1} | {n2}.
func TestPartitionHeals(t *testing.T) {
	var (
		cut  atomic.Bool
		mu   sync.Mutex
		side = map[string]bool{} // gossip address → on n2's side
	)
	gs := startCluster(t, 3, func(i int, c *Config) {
		lone := i == 2
		c.Drop = func(to string) bool {
			mu.Lock()
			defer mu.Unlock()
			s, ok := side[to]
			return cut.Load() && ok && s != lone
		}
	})
	all := names(gs)
	poll.Until(t, 10*time.Second, "3 alive", func() bool { return allAlive(gs, all...) })
	mu.Lock()
	for i, g := range gs {
		side[g.LocalAddr()] = i == 2
	}
	mu.Unlock()
	cut.Store(true)
	// Dead, and stale too: the verdict is then hundreds of milliseconds old, and memberlist's
	// own messages about it, which could still reach the other side and be refuted, are spent.
	dead := func(g *Gossip, name string) bool {
		m, _ := member(g, name)
		return m.Liveness == LivenessDead && m.Stale
	}
	poll.Until(t, 10*time.Second, "each side to hold the other dead", func() bool {
		return dead(gs[0], "n2") && dead(gs[1], "n2") && dead(gs[2], "n0") && dead(gs[2], "n1")
	})
	lone, pair := promptBlocks("stored on the lone side. "), promptBlocks("stored on the pair's side. ")
	gs[2].PrefixStored(lone)
	gs[0].PrefixStored(pair)
	cut.Store(false)
	poll.Until(t, 10*time.Second, "the mesh whole again, with both prefixes everywhere", func() bool {
		return allAlive(gs, all...) && everyoneSees(gs, "n2", lone, kvindex.AnchoredLen(len(lone))) && everyoneSees(gs, "n0", pair, kvindex.AnchoredLen(len(pair)))
	})
}
