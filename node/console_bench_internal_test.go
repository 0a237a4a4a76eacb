package node

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/node/console"
	"github.com/kvmesh/kvmesh/node/metrics"
)

// BenchmarkConsoleState is the cost of one build of the console's state (what one second
// of an open console costs the node) with a mesh of 64 and 1,000 peers: the peers' records,
// the node's metric families and its forward counts.
func BenchmarkConsoleState(b *testing.B) {
	for _, peers := range []int{64, 1000} {
		b.Run(fmt.Sprintf("peers=%d", peers), func(b *testing.B) {
			resp := PeersResponse{Node: "n0", Peers: make([]PeerInfo, peers)}
			for i := range resp.Peers {
				resp.Peers[i] = PeerInfo{Name: fmt.Sprintf("n%d", i), Liveness: "alive", HTTPAddr: "10.0.0.1:8080",
					QUICAddr: "10.0.0.1:7947", GossipAddr: "10.0.0.1:7946", Role: "whole", EngineKind: "vllm", EngineHealthy: true,
					Models: []gossip.ModelInfo{{Name: "llama-3.1-8b"}}, KVUse: 0.5, Running: 12, Waiting: 3, PrefixBlocks: 4096,
					PowerWatts: 500, TempC: 60, CarbonZone: "DE", CarbonIntensity: 300}
			}
			reg := prometheus.NewRegistry()
			m := metrics.New(reg, admit.SLOConfig{}, Version)
			m.Decision(admit.LayerSLO, admit.Accept, "accepted")
			c, err := console.New(console.Config{Node: "n0", Peers: func() any { return resp }, Gatherer: reg, Interval: time.Nanosecond})
			if err != nil {
				b.Fatal(err)
			}
			for i := range min(peers, 64) {
				c.ForwardSent(resp.Peers[i].Name)
			}
			b.ReportAllocs()
			var size int
			for b.Loop() {
				s, err := c.State()
				if err != nil {
					b.Fatal(err)
				}
				size = len(s)
			}
			b.ReportMetric(float64(size), "bytes/state")
		})
	}
}
