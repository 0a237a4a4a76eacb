package testnet_test

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet"
)

// sumMetric sums a metric family's samples over nodes.
func sumMetric(b *testing.B, nodes []*node.Node, name string) float64 {
	var sum float64
	for _, n := range nodes {
		mfs, err := n.Registry().Gather()
		if err != nil {
			b.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// BenchmarkPrefixPropagation16 measures, on a 16-node testnet with memberlist's LAN timers,
// the time from an engine storing a new 2,048-token prefix (its first output byte, which comes
// right after the prefill that stores it) until every other node's index holds all its 8
// anchors (what gossip carries of its 128 blocks), and
// the gossip bytes each node sends per second meanwhile.
// go test -run '^$' -bench PrefixPropagation16 -benchtime 20x ./testnet/
func BenchmarkPrefixPropagation16(b *testing.B) {
	const nodes, promptTokens = 16, 2048
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tn, err := testnet.Start(ctx, testnet.Config{Nodes: nodes, Configure: func(i int, cfg *node.Config) {
		cfg.Sim.TimeScale = 20
		cfg.GPU = "none"
	}})
	if err != nil {
		b.Fatal(err)
	}
	defer tn.Close()
	if err := tn.WaitConverged(ctx); err != nil {
		b.Fatal(err)
	}
	urls := tn.URLs()
	var lat []time.Duration
	bytes0, t0 := sumMetric(b, tn.Nodes, "kvmesh_gossip_sent_bytes_total"), time.Now()
	i := 0
	for b.Loop() {
		i++
		prompt := strings.Repeat(fmt.Sprintf("propagation trial %06d ", i), promptTokens*4/24+1)[:promptTokens*4]
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":2,"stream":true}`, node.DefaultModel, prompt)
		base := counts(tn)
		resp, err := http.Post(urls[i%nodes]+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		buf := make([]byte, 1)
		if _, err := resp.Body.Read(buf); err != nil {
			b.Fatal(err)
		}
		stored := time.Now()
		owner := resp.Header.Get(node.HeaderNode)
		resp.Body.Close()
		deadline := stored.Add(30 * time.Second)
		for !allKnow(tn, base, owner, len(kvindex.AppendAnchors(nil, make([]uint64, promptTokens/16)))) {
			if time.Now().After(deadline) {
				b.Fatalf("trial %d: the prefix on %s did not reach every node in 30s", i, owner)
			}
			time.Sleep(time.Millisecond) // benchmark polling, not a test wait
		}
		lat = append(lat, time.Since(stored))
	}
	elapsed := time.Since(t0).Seconds()
	sort.Slice(lat, func(a, c int) bool { return lat[a] < lat[c] })
	b.ReportMetric(float64(lat[len(lat)/2].Milliseconds()), "p50-ms")
	b.ReportMetric(float64(lat[(len(lat)*99)/100].Milliseconds()), "p99-ms")
	b.ReportMetric((sumMetric(b, tn.Nodes, "kvmesh_gossip_sent_bytes_total")-bytes0)/elapsed/nodes, "gossip-B/s/node")
}

// counts snapshots, per viewing node, how many prefix blocks it knows for each member.
func counts(tn *testnet.Net) map[string]map[string]int {
	out := map[string]map[string]int{}
	for _, n := range tn.Nodes {
		v := map[string]int{}
		for _, m := range n.Members() {
			v[m.Name] = m.PrefixBlocks
		}
		out[n.Name()] = v
	}
	return out
}

// allKnow reports whether every node other than owner knows at least grow more of owner's
// blocks than in base: each trial's prompt is new, so the growth is its anchors arriving.
func allKnow(tn *testnet.Net, base map[string]map[string]int, owner string, grow int) bool {
	for _, n := range tn.Nodes {
		if n.Name() == owner {
			continue
		}
		ok := false
		for _, m := range n.Members() {
			if m.Name == owner && m.PrefixBlocks >= base[n.Name()][owner]+grow {
				ok = true
			}
		}
		if !ok {
			return false
		}
	}
	return true
}
