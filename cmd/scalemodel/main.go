// Command scalemodel prints testnet/scalemodel's predictions for meshes of several sizes, each
// with every node serving one model and with the nodes split into models of -domain nodes,
// as a Markdown table. Every input of the model is a flag; the defaults are kvmesh's and the
// Mooncake trace's, uncalibrated.
//
//	go run ./cmd/scalemodel -nodes 128,256,512,1000
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
	sizes := fs.String("nodes", "128,256,512,1000", "mesh sizes, comma-separated")
	domain := fs.Int("domain", 100, "the second row of each size splits the mesh into models of about this many nodes (0: one row)")
	c := d
	fs.DurationVar(&c.GossipInterval, "gossip-interval", d.GossipInterval, "memberlist's GossipInterval")
	fs.IntVar(&c.GossipNodes, "gossip-nodes", d.GossipNodes, "memberlist's GossipNodes (fanout)")
	fs.IntVar(&c.RetransmitMult, "retransmit-mult", d.RetransmitMult, "retransmissions: this × ceil(log10(n+1))")
	fs.IntVar(&c.PacketBytes, "packet-bytes", d.PacketBytes, "a gossip packet's payload budget")
	fs.IntVar(&c.MaxBytesPerSecond, "max-bytes-per-second", d.MaxBytesPerSecond, "each node's gossip byte budget")
	fs.IntVar(&c.MaxMessage, "max-message", d.MaxMessage, "a delta message's largest size")
	fs.DurationVar(&c.FlushInterval, "flush-interval", d.FlushInterval, "how often deltas are cut into messages")
	fs.DurationVar(&c.PublishInterval, "publish-interval", d.PublishInterval, "a state record's period")
	fs.DurationVar(&c.StaleAfter, "stale-after", d.StaleAfter, "a record older than this is stale")
	fs.Float64Var(&c.Churn, "churn", d.Churn, "blocks each node stores a second (as many evicted)")
	fs.IntVar(&c.Resident, "resident", d.Resident, "blocks each engine holds")
	fs.IntVar(&c.MaxBlocksPerPeer, "max-blocks-per-peer", d.MaxBlocksPerPeer, "the index's cap a peer")
	fs.DurationVar(&c.HopLatency, "hop-latency", d.HopLatency, "calibration: from a send to the receiver's use of the message")
	fs.IntVar(&c.RecordBytes, "record-bytes", d.RecordBytes, "calibration: a state record with its envelope")
	fs.IntVar(&c.PacketOverhead, "packet-overhead", d.PacketOverhead, "calibration: wire bytes a packet adds")
	fs.Float64Var(&c.EntryBytes, "entry-bytes", d.EntryBytes, "calibration: the index's heap a (peer, block) entry")
	fs.Float64Var(&c.DistinctBytes, "distinct-bytes", d.DistinctBytes, "calibration: the index's heap a distinct block hash")
	fs.DurationVar(&c.Warmup, "warmup", d.Warmup, "simulated time before measuring")
	fs.DurationVar(&c.Duration, "duration", d.Duration, "simulated time measured")
	fs.DurationVar(&c.ProbeTimeout, "probe-timeout", d.ProbeTimeout, "a probe not visible after this counts as not visible")
	fs.IntVar(&c.Probes, "probes", d.Probes, "new prefixes stored during the measured time")
	fs.Uint64Var(&c.Seed, "seed", d.Seed, "random seed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var ns []int
	for _, f := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 {
			return fmt.Errorf("-nodes: %q is not a mesh size of 2 or more", f)
		}
		ns = append(ns, n)
	}
	fmt.Fprintf(out, "| nodes | models × nodes | visible p50 | p99 | visible | record age p50 | p99 | stale | state kB/s | prefix kB/s | wire kB/s | push/pull kB/s | sends / limit | delta demand MB/s | index MiB |\n")
	fmt.Fprintf(out, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
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
			fmt.Fprintf(out, "| %d | %d × %d | %s | %s | %.0f%% | %s | %s | %.0f%% | %.1f | %.1f | %.1f | %.1f | %.1f / %d | %.1f | %.0f |\n",
				n, m, r.Domain, dur(r.VisibleP50), dur(r.VisibleP99), 100*r.Visible, dur(r.RecordAgeP50), dur(r.RecordAgeP99),
				100*r.Stale, r.StateBytes/1e3, r.PrefixBytes/1e3, r.WireBytes/1e3, r.PushPullBytes/1e3, r.Sends, r.DeltaLimit, r.DeltaDemand/1e6, r.IndexBytes/(1<<20))
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
