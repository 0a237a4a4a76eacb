// Command scalemodel prints testnet/scalemodel's predictions for meshes of several sizes, each
// with every node serving one model and with the nodes split into models of -domain nodes,
// as a Markdown table. Every input of the model is a flag; the defaults are kvmesh's and the
// Mooncake trace's, with the inputs fitted on BenchmarkScale's 16-, 32- and 64-node runs.
// -light runs the model as BenchmarkScale runs its nodes (docs/performance.md, "Scale").
//
//	go run ./cmd/scalemodel -nodes 128,256,512,1000
//	go run ./cmd/scalemodel -light -nodes 16,32,64 -domain 0
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/testnet/scalemodel"
)

// lightRecordBytes is a light testnet node's state record with its envelope, fitted on
// BenchmarkScale's bytes without churn.
const lightRecordBytes = 122

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "scalemodel:", err)
		os.Exit(2)
	}
}

func run(args []string, out io.Writer) error {
	d := scalemodel.DefaultConfig()
	fs := flag.NewFlagSet("scalemodel", flag.ContinueOnError)
	fs.SetOutput(out)
	sizes := fs.String("nodes", "16,32,64,128,256,512,1000", "mesh sizes, comma-separated")
	domain := fs.Int("domain", 100, "the second row of each size splits the mesh into models of about this many nodes (0: one row)")
	trace := fs.String("trace", "", "a Mooncake-format trace to take -anchor-fraction from (512-token hash ids, 16-token blocks)")
	c := d
	fs.DurationVar(&c.GossipInterval, "gossip-interval", d.GossipInterval, "memberlist's GossipInterval")
	fs.IntVar(&c.GossipNodes, "gossip-nodes", d.GossipNodes, "memberlist's GossipNodes (fanout)")
	fs.IntVar(&c.RetransmitMult, "retransmit-mult", d.RetransmitMult, "a record's transmissions: this × ceil(log10(n+1))")
	fs.IntVar(&c.PacketBytes, "packet-bytes", d.PacketBytes, "a memberlist gossip packet's payload budget")
	fs.DurationVar(&c.PublishInterval, "publish-interval", d.PublishInterval, "a state record's period")
	fs.DurationVar(&c.MeshPublishInterval, "mesh-publish-interval", 0, "records' period to the whole mesh (0: gossip.MeshInterval for the mesh)")
	fs.DurationVar(&c.StaleAfter, "stale-after", d.StaleAfter, "a domain peer's record older than this is stale")
	fs.DurationVar(&c.PushPullInterval, "push-pull-interval", d.PushPullInterval, "memberlist's PushPullInterval")
	fs.DurationVar(&c.PrefixInterval, "prefix-interval", d.PrefixInterval, "how often a node sends its anchor deltas to its domain")
	fs.IntVar(&c.MaxPayload, "max-payload", d.MaxPayload, "a prefix packet's largest payload, header included")
	fs.IntVar(&c.DeltaHeader, "delta-header", d.DeltaHeader, "a prefix packet's delta header")
	fs.IntVar(&c.MaxBytesPerSecond, "max-bytes-per-second", d.MaxBytesPerSecond, "each node's gossip byte budget")
	fs.Float64Var(&c.Churn, "churn", d.Churn, "blocks each node stores a second (as many evicted)")
	fs.Float64Var(&c.AnchorFraction, "anchor-fraction", d.AnchorFraction, "the share of stored and evicted blocks that are anchors")
	fs.IntVar(&c.Resident, "resident", d.Resident, "blocks each engine holds (-1: none)")
	fs.IntVar(&c.MaxBlocksPerPeer, "max-blocks-per-peer", d.MaxBlocksPerPeer, "the index's cap a peer")
	fs.DurationVar(&c.HopLatency, "hop-latency", d.HopLatency, "calibration: from a send to the receiver's use of the message")
	fs.IntVar(&c.RecordBytes, "record-bytes", d.RecordBytes, "calibration: a state record with its envelope")
	fs.IntVar(&c.PacketOverhead, "packet-overhead", d.PacketOverhead, "calibration: bytes a packet adds to its payload (encryption, memberlist framing)")
	fs.Float64Var(&c.EntryBytes, "entry-bytes", d.EntryBytes, "calibration: the index's heap a (peer, block) entry")
	fs.Float64Var(&c.DistinctBytes, "distinct-bytes", d.DistinctBytes, "calibration: the index's heap a distinct block hash")
	fs.DurationVar(&c.Warmup, "warmup", d.Warmup, "simulated time before measuring")
	fs.DurationVar(&c.Duration, "duration", d.Duration, "simulated time measured")
	fs.DurationVar(&c.ProbeTimeout, "probe-timeout", d.ProbeTimeout, "a probe not visible after this counts as not visible")
	fs.IntVar(&c.Probes, "probes", d.Probes, "new prefixes stored during the measured time (at most, with -probe-gap)")
	fs.DurationVar(&c.ProbeGap, "probe-gap", 0, "probes one after another, the next this to a fifth of it after the last was visible (0: spread evenly)")
	light := fs.Bool("light", false, "BenchmarkScale's run: light nodes (records every 5 s, stale after 15 s, 122-byte records, pools of 4,096 blocks), its churn's anchors (7 of 471), probes in turn (-probe-gap 500ms) over 60 s; flags set explicitly win")
	fs.Uint64Var(&c.Seed, "seed", d.Seed, "random seed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *light {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		for name, v := range map[string]any{
			"publish-interval": &c.PublishInterval, "stale-after": &c.StaleAfter, "record-bytes": &c.RecordBytes,
			"resident": &c.Resident, "anchor-fraction": &c.AnchorFraction, "probe-gap": &c.ProbeGap,
			"duration": &c.Duration, "probes": &c.Probes,
		} {
			if set[name] {
				continue
			}
			switch p := v.(type) {
			case *time.Duration:
				*p = map[string]time.Duration{"publish-interval": 5 * time.Second, "stale-after": 15 * time.Second,
					"probe-gap": 500 * time.Millisecond, "duration": 60 * time.Second}[name]
			case *int:
				*p = map[string]int{"record-bytes": lightRecordBytes, "resident": 4096, "probes": 1000}[name]
				if name == "resident" && c.Churn == 0 {
					*p = -1 // BenchmarkScale's pools fill only with churn
				}
			case *float64:
				*p = 7.0 / 471
			}
		}
	}
	var ns []int
	for _, f := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 {
			return fmt.Errorf("-nodes: %q is not a mesh size of 2 or more", f)
		}
		ns = append(ns, n)
	}
	if *trace != "" {
		f, err := os.Open(*trace)
		if err != nil {
			return err
		}
		b, err := scalemodel.CountTraceBlocks(f, 512, 16)
		f.Close()
		if err != nil {
			return err
		}
		c.AnchorFraction = b.Fraction()
		fmt.Fprintf(out, "%s: %d requests, %d new blocks, %d anchors: anchor fraction %.5f\n\n", *trace, b.Requests, b.New, b.Anchors, c.AnchorFraction)
	}
	fmt.Fprintf(out, "| nodes | models × nodes | mesh interval | visible p50 | p99 | visible | in-domain record age p50 | p99 | stale | out-of-domain age p50 | p99 | stale | mesh records kB/s | direct records kB/s | prefix kB/s | sent kB/s | received kB/s | wire kB/s | prefix demand kB/s | waited | dropped | join burst kB | index MiB |\n")
	fmt.Fprintf(out, "|%s\n", strings.Repeat(" --- |", 23))
	for _, n := range ns {
		models := []int{1}
		if *domain > 0 && n / *domain >= 2 {
			models = append(models, n / *domain)
		}
		for _, m := range models {
			cfg := c
			cfg.Nodes, cfg.Models = n, m
			r, err := scalemodel.Run(cfg)
			if err != nil {
				return err
			}
			out3 := "— | — | —"
			if m > 1 {
				out3 = fmt.Sprintf("%s | %s | %.0f%%", dur(r.OutAgeP50), dur(r.OutAgeP99), 100*r.OutStale)
			}
			fmt.Fprintf(out, "| %d | %d × %d | %s | %s | %s | %.0f%% | %s | %s | %.0f%% | %s | %.2f | %.2f | %.1f | %.1f | %.1f | %.1f | %.1f | %.0f%% | %.0f%% | %.0f | %.2f |\n",
				n, m, r.Domain, dur(r.MeshInterval), dur(r.VisibleP50), dur(r.VisibleP99), 100*r.Visible,
				dur(r.InAgeP50), dur(r.InAgeP99), 100*r.InStale, out3,
				r.MeshRecordBytes/1e3, r.DirectRecordBytes/1e3, r.PrefixSent/1e3, r.Sent/1e3, r.Received/1e3, r.WireBytes/1e3,
				r.PrefixDemand/1e3, 100*r.Waited, 100*r.Dropped, r.JoinBurst/1e3, r.IndexBytes/(1<<20))
		}
	}
	return nil
}

// dur prints a duration to two significant figures; "—" for none, "never" for unbounded.
func dur(d time.Duration) string {
	switch {
	case d == 0:
		return "—"
	case d == time.Duration(1<<63-1):
		return "never"
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Round(time.Millisecond).Milliseconds())
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}
