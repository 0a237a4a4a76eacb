//go:build unix

package testnet_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet"
)

// The scale harness's knobs, from the environment (KVMESH_SCALE_*), with their defaults.
const (
	// scaleChurn is the blocks each node's engine stores a second (and, once its pool is
	// full, evicts): the Mooncake conversation trace at the 4-node bench's capacity (40 req/s
	// at --scale 0.25, 10 a node), whose requests each bring 7,538 tokens seen nowhere before
	// (its hash ids' first occurrences, 63% of its blocks) at a quarter length: 10 × 7,538 / 4
	// / 16 = 1,178 new 16-token blocks a second a node, about a simulated H100's prefill rate.
	scaleChurn = 1180
	// scaleResident is each node's synthetic pool, in blocks: the light nodes' KV pool.
	scaleResident = 4096
	// The churn's blocks come as the trace's requests bring them: a request of 11,965 tokens
	// (7,538 new ones are 63% of it) is 748 blocks, a cached head of 277 then 471 new blocks,
	// at chain positions 277..747. Only their anchors reach gossip (319, 383, ..., 703: 7 in
	// 471 blocks, 1.5%, as over the whole trace: testnet/scalemodel's TestTraceAnchorFraction).
	// Full-length requests, not the bench's quarter-length ones: the churn is a rate of blocks
	// (an engine's prefill rate), and the anchors' share depends on where in a chain they are.
	scaleHeadBlocks, scaleNewBlocks = 277, 471
)

func scaleEnv(name string, def float64) float64 {
	if v, err := strconv.ParseFloat(os.Getenv("KVMESH_SCALE_"+name), 64); err == nil {
		return v
	}
	return def
}

// BenchmarkScale measures light testnets of 16, 32 and 64 nodes (KVMESH_SCALE_NODES, a
// comma-separated list) with memberlist's LAN timers, every node serving one model, while
// every node's engine stores KVMESH_SCALE_CHURN blocks a second (default 1,180: the Mooncake
// conversation trace's per-node rate, scaleChurn) in a pool of KVMESH_SCALE_RESIDENT blocks
// (4,096), their anchors fed to gossip directly as a node feeds its engine's (the engines stay
// idle, so the machine's cores go to the mesh). For each size:
//
//   - converge-s: from the first node's start until every node sees every other with a fresh
//     record; join-s: one more node, until every node sees it; death-s: that node stopped
//     without a word, until every other node sees it dead.
//   - visible-p50-ms, visible-p99-ms: a new 2,048-token prefix (128 blocks, 8 anchors) stored
//     on a random node, until every other node's index matches all of it; probes one after
//     another over a window of KVMESH_SCALE_DURATION seconds (default 60); visible-%: the
//     probes that made it within 30 s. With fewer than 100 probes p99 is the slowest.
//   - sent-B/s/node, recv-B/s/node: kvmesh gossip bytes (kvmesh_gossip_*_bytes_total: state
//     records, prefix deltas and push/pull payloads; not memberlist's own probes and headers).
//   - cpu-cores/node, rss-MiB/node: the whole process's CPU time and resident memory (the
//     harness's own included) over the window, divided by the node count.
//   - index-MiB/node: kvmesh_gossip_index_bytes, averaged over the nodes.
//
// KVMESH_SCALE_NODES=16,32,64 go test -run '^$' -bench Scale -benchtime 1x -timeout 60m ./testnet/
func BenchmarkScale(b *testing.B) {
	sizes := os.Getenv("KVMESH_SCALE_NODES")
	if sizes == "" {
		sizes = "16,32,64"
	}
	for _, f := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 {
			b.Fatalf("KVMESH_SCALE_NODES: %q is not a node count of 2 or more", f)
		}
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			for b.Loop() {
				scaleRun(b, n)
			}
		})
	}
}

func scaleRun(b *testing.B, nodes int) {
	churn := scaleEnv("CHURN", scaleChurn)
	resident := int(scaleEnv("RESIDENT", scaleResident))
	window := time.Duration(scaleEnv("DURATION", 60) * float64(time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), window+10*time.Minute)
	defer cancel()

	start := time.Now()
	tn, err := testnet.Start(ctx, testnet.Config{Nodes: nodes, Light: true, Configure: func(i int, cfg *node.Config) {
		cfg.Gossip.LeaveTimeout = -1 // a stopped node is found dead, as after a crash
	}})
	if err != nil {
		b.Fatal(err)
	}
	defer tn.Close()
	if err := tn.WaitConverged(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(time.Since(start).Seconds(), "converge-s")

	pools := make([]*pool, nodes)
	for i, n := range tn.Nodes {
		pools[i] = &pool{g: n.Gossip(), max: resident, rng: rand.New(rand.NewPCG(uint64(i), 7))}
		n.Gossip().SetSnapshot(pools[i].snapshot)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		churnLoop(pools, churn, stop)
	}()
	defer func() { close(stop); wg.Wait() }()

	// Membership: a join, then that node's death.
	start = time.Now()
	added, err := tn.Add(ctx)
	if err != nil {
		b.Fatal(err)
	}
	waitAll(b, tn.Nodes[:nodes], "the new node", func(ms []gossip.Member) bool {
		m, ok := find(ms, added.Name())
		return ok && m.Liveness == gossip.LivenessAlive && m.Candidate
	})
	b.ReportMetric(time.Since(start).Seconds(), "join-s")
	start = time.Now()
	if err := added.Shutdown(ctx); err != nil {
		b.Fatal(err)
	}
	waitAll(b, tn.Nodes[:nodes], "the stopped node's death", func(ms []gossip.Member) bool {
		m, ok := find(ms, added.Name())
		return ok && m.Liveness == gossip.LivenessDead
	})
	b.ReportMetric(time.Since(start).Seconds(), "death-s")

	// The window: probes one after another, bytes, CPU and memory around them.
	sent0, recv0 := sumMetric(b, tn.Nodes[:nodes], "kvmesh_gossip_sent_bytes_total"), sumMetric(b, tn.Nodes[:nodes], "kvmesh_gossip_received_bytes_total")
	cpu0, t0 := cpuTime(), time.Now()
	rng := rand.New(rand.NewPCG(1, 2))
	var lat []time.Duration
	probes := 0
	for time.Since(t0) < window {
		probes++
		origin := rng.IntN(nodes)
		blocks := pools[origin].probe()
		if d, ok := visible(tn.Nodes[:nodes], origin, blocks, 30*time.Second); ok {
			lat = append(lat, d)
		}
		time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond) // spacing between probes, not a wait
	}
	elapsed := time.Since(t0).Seconds()
	cpu := cpuTime() - cpu0
	per := float64(nodes) * elapsed
	b.ReportMetric((sumMetric(b, tn.Nodes[:nodes], "kvmesh_gossip_sent_bytes_total")-sent0)/per, "sent-B/s/node")
	b.ReportMetric((sumMetric(b, tn.Nodes[:nodes], "kvmesh_gossip_received_bytes_total")-recv0)/per, "recv-B/s/node")
	b.ReportMetric(cpu.Seconds()/per, "cpu-cores/node")
	b.ReportMetric(float64(rss())/float64(nodes)/(1<<20), "rss-MiB/node")
	b.ReportMetric(sumMetric(b, tn.Nodes[:nodes], "kvmesh_gossip_index_bytes")/float64(nodes)/(1<<20), "index-MiB/node")
	b.ReportMetric(churn, "churn-blocks/s/node")
	b.ReportMetric(100*float64(len(lat))/float64(max(probes, 1)), "visible-%")
	if len(lat) > 0 {
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Milliseconds()), "visible-p50-ms")
		b.ReportMetric(float64(lat[min(len(lat)*99/100, len(lat)-1)].Milliseconds()), "visible-p99-ms")
	}
}

// pool is one node's synthetic engine residency: blocks stored and evicted at the churn rate,
// oldest first, plus the probes' prefixes, which stay. Gossip gets the anchors, as from a
// node's engine, and its snapshot reads them.
type pool struct {
	g   *gossip.Gossip
	max int
	rng *rand.Rand

	mu     sync.Mutex
	blocks []poolBlock // oldest first
	pos    int         // the chain position of the next new block
	probes []uint64    // the probes' anchors
}

type poolBlock struct {
	hash uint64
	pos  int
}

// step stores n new blocks and evicts what the pool no longer holds.
func (p *pool) step(n int) {
	var d kvindex.CacheDelta
	p.mu.Lock()
	for range n {
		if p.pos < scaleHeadBlocks || p.pos >= scaleHeadBlocks+scaleNewBlocks {
			p.pos = scaleHeadBlocks // the next request's new blocks
		}
		b := poolBlock{p.rng.Uint64(), p.pos}
		p.pos++
		p.blocks = append(p.blocks, b)
		d.Store(b.hash, b.pos)
	}
	if over := len(p.blocks) - p.max; over > 0 {
		for _, b := range p.blocks[:over] {
			d.Evict(b.hash, b.pos)
		}
		p.blocks = slices.Delete(p.blocks, 0, over)
	}
	p.mu.Unlock()
	p.g.PrefixStored(d.StoredAnchors)
	p.g.PrefixEvicted(d.EvictedAnchors)
}

// probe stores a new 2,048-token prefix and returns its blocks.
func (p *pool) probe() []uint64 {
	p.mu.Lock()
	text := fmt.Appendf(nil, "probe %d %d ", p.rng.Uint64(), len(p.probes))
	text = []byte(strings.Repeat(string(text), 2048*kvindex.BytesPerToken/len(text)+1)[:2048*kvindex.BytesPerToken])
	blocks := kvindex.Blocks(node.DefaultModel, text, kvindex.DefaultBlockTokens)
	anchors := kvindex.AppendAnchors(nil, blocks)
	p.probes = append(p.probes, anchors...)
	p.mu.Unlock()
	p.g.PrefixStored(anchors)
	return blocks
}

func (p *pool) snapshot() []uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := slices.Clone(p.probes)
	for _, b := range p.blocks {
		if kvindex.Anchor(b.pos) {
			out = append(out, b.hash)
		}
	}
	return out
}

// churnLoop steps every pool every 50 ms (gossip's flush) by churn a second until stop.
func churnLoop(pools []*pool, churn float64, stop <-chan struct{}) {
	const every = 50 * time.Millisecond
	t := time.NewTicker(every)
	defer t.Stop()
	carry := 0.0
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		carry += churn * every.Seconds()
		n := int(carry)
		carry -= float64(n)
		if n == 0 {
			continue
		}
		for _, p := range pools {
			p.step(n)
		}
	}
}

// visible waits until every node other than origin matches all of blocks for origin (their
// anchored length, kvindex.AnchoredLen) and returns how long that took, or false after timeout.
func visible(nodes []*node.Node, origin int, blocks []uint64, timeout time.Duration) (time.Duration, bool) {
	start := time.Now()
	name := nodes[origin].Name()
	waiting := make([]*node.Node, 0, len(nodes))
	for i, n := range nodes {
		if i != origin {
			waiting = append(waiting, n)
		}
	}
	want := kvindex.AnchoredLen(len(blocks))
	var dst []kvindex.Match
	for len(waiting) > 0 {
		if time.Since(start) > timeout {
			return 0, false
		}
		waiting = slices.DeleteFunc(waiting, func(n *node.Node) bool {
			dst = n.Gossip().LongestPrefix(blocks, dst[:0])
			return slices.ContainsFunc(dst, func(m kvindex.Match) bool { return m.Peer == name && m.Blocks == want })
		})
		time.Sleep(5 * time.Millisecond) // the resolution latency is measured to
	}
	return time.Since(start), true
}

// waitAll polls every node's member list until cond holds for all of them (a minute at most).
func waitAll(b *testing.B, nodes []*node.Node, what string, cond func([]gossip.Member) bool) {
	b.Helper()
	deadline := time.Now().Add(time.Minute)
	for _, n := range nodes {
		for !cond(n.Members()) {
			if time.Now().After(deadline) {
				b.Fatalf("%s: %s not seen within a minute", n.Name(), what)
			}
			time.Sleep(20 * time.Millisecond) // the resolution the figure is measured to
		}
	}
}

func find(ms []gossip.Member, name string) (gossip.Member, bool) {
	for _, m := range ms {
		if m.Name == name {
			return m, true
		}
	}
	return gossip.Member{}, false
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// rss is the process's resident memory in bytes (Linux; 0 elsewhere).
func rss() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize())
}
