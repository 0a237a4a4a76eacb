package node_test

import (
	"context"
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet"
)

// startEngine serves a fast simulated engine alone (kvmesh engine), so what the benchmarks
// below measure is kvmesh's own overhead, not the simulated GPU; configure, if given, adjusts
// its configuration first.
func startEngine(tb testing.TB, configure ...func(*node.Config)) string {
	tb.Helper()
	cfg := node.DefaultConfig()
	cfg.Name, cfg.HTTPAddr, cfg.Standalone, cfg.GPU = "engine", "127.0.0.1:0", true, "none"
	// 100× real time: tokens arrive every ~50 µs per stream, still far faster than a real GPU,
	// so per-chunk overhead shows without dominating.
	cfg.Sim.TimeScale = 100
	cfg.Sim.KVBlocks = 1 << 16
	cfg.DrainDelay = -1 // as kvmesh engine's: nothing waits for its readiness to drop
	for _, f := range configure {
		f(&cfg)
	}
	n, err := node.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = n.Shutdown(context.Background()) })
	return "http://" + n.HTTPAddr()
}

// hopPaths returns the three ways to reach the same engine: directly, through one node that
// runs it as its external engine, and through a second node that has to forward over QUIC.
func hopPaths(tb testing.TB) map[string]string {
	engine := startEngine(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tn, err := testnet.Start(ctx, testnet.Config{Nodes: 2, Fast: true, Configure: func(i int, cfg *node.Config) {
		cfg.GPU = "none"
		if i == 0 {
			cfg.Engine = engine // the owner: the only node serving the model
			return
		}
		cfg.Models = []string{"another-model"} // the ingress: must forward
	}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = tn.Close() })
	if err := tn.WaitConverged(ctx); err != nil {
		tb.Fatal(err)
	}
	u := tn.URLs()
	return map[string]string{"direct": engine, "one-node": u[0], "forward": u[1]}
}

// BenchmarkForwardHop measures, side by side in one run, time to first byte and streaming
// throughput straight to the engine, through one node, and through a forward hop.
// go test -run '^$' -bench ForwardHop -benchtime 300x ./node/
func BenchmarkForwardHop(b *testing.B) {
	paths := hopPaths(b)
	body := chatBody(strings.Repeat("benchmark prompt ", 64), 256, true)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	for _, name := range []string{"direct", "one-node", "forward"} {
		url := paths[name]
		b.Run(name, func(b *testing.B) {
			ttfb := make([]time.Duration, 0, b.N)
			var bytes int64
			start := time.Now()
			for b.Loop() {
				t0 := time.Now()
				resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				buf := make([]byte, 4096)
				nr, err := resp.Body.Read(buf)
				if err != nil && err != io.EOF {
					b.Fatal(err)
				}
				ttfb = append(ttfb, time.Since(t0))
				rest, _ := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || resp.Header.Get(node.HeaderNode) == "" {
					b.Fatalf("%s: status %d node %q", name, resp.StatusCode, resp.Header.Get(node.HeaderNode))
				}
				bytes += int64(nr) + rest
			}
			elapsed := time.Since(start)
			sort.Slice(ttfb, func(i, j int) bool { return ttfb[i] < ttfb[j] })
			b.ReportMetric(float64(ttfb[len(ttfb)/2].Microseconds()), "ttfb-p50-µs")
			b.ReportMetric(float64(ttfb[len(ttfb)*99/100].Microseconds()), "ttfb-p99-µs")
			b.ReportMetric(float64(bytes)/elapsed.Seconds()/1e6, "MB/s")
		})
	}
}
