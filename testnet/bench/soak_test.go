package bench

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/node"
)

// soakSample is one reading of the soak benchmark.
type soakSample struct {
	at                     time.Duration // since the benchmark started; -1: after the testnets closed
	rssBytes               int64         // -1 where /proc is not there
	goroutines, openFiles  int
	queued, queuedPrefills float64 // the nodes' waiting rooms, summed
}

// BenchmarkSoak runs kvmesh on a 3-node testnet at 1.5× its capacity for KVMESH_SOAK_DURATION
// (default 10m), and every 10 s samples the process's resident memory, goroutines and open
// files (the nodes, their engines and the load generator share the process) and the requests
// waiting in the nodes' waiting rooms; it prints them as a table, the goodput table after it.
// A leak shows as a column that keeps growing under a steady overload, and as a last row,
// taken once every testnet has closed, above the first. KVMESH_SOAK_CAPACITY (requests per
// second, as `kvmesh bench --capacity`) skips the capacity probe. It runs only when -bench names
// it (`-bench .` skips it):
//
//	KVMESH_SOAK_DURATION=10m go test -run '^$' -bench Soak -benchtime 1x -timeout 30m ./testnet/bench/
func BenchmarkSoak(b *testing.B) {
	if f := flag.Lookup("test.bench"); f == nil || !strings.Contains(f.Value.String(), "Soak") {
		b.Skip("the soak runs for minutes: select it with -bench Soak")
	}
	duration := 10 * time.Minute
	if v := os.Getenv("KVMESH_SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			b.Fatalf("KVMESH_SOAK_DURATION=%q: want a positive duration", v)
		}
		duration = d
	}
	cfg := DefaultConfig()
	cfg.Nodes = 3
	cfg.Loads = []float64{1.5}
	cfg.Duration = duration
	kvmesh, _ := PolicyByName(KvmeshPolicy)
	cfg.Policies = []Policy{kvmesh}
	if v := os.Getenv("KVMESH_SOAK_CAPACITY"); v != "" {
		c, err := strconv.ParseFloat(v, 64)
		if err != nil || c <= 0 {
			b.Fatalf("KVMESH_SOAK_CAPACITY=%q: want a positive rate", v)
		}
		cfg.Capacity = c
	}
	// Each node gets a registry of its own, so that the sampler can read its waiting room;
	// the latest testnet's (the probe's, then the run's) are the ones read.
	var mu sync.Mutex
	regs := make([]*prometheus.Registry, cfg.Nodes)
	cfg.Configure = func(i int, nc *node.Config) {
		nc.Registry = prometheus.NewRegistry()
		mu.Lock()
		regs[i] = nc.Registry
		mu.Unlock()
	}
	for range b.N {
		start := time.Now()
		var samples []soakSample
		sample := func(at time.Duration) {
			mu.Lock()
			rs := append([]*prometheus.Registry(nil), regs...)
			mu.Unlock()
			s := soakSample{at: at, rssBytes: rss(), goroutines: runtime.NumGoroutine(), openFiles: openFiles()}
			s.queued, s.queuedPrefills = gauge(rs, "kvmesh_admission_queue_requests"), gauge(rs, "kvmesh_admission_queue_prefill_tokens")
			samples = append(samples, s)
		}
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			t := time.NewTicker(10 * time.Second)
			defer t.Stop()
			sample(0)
			for {
				select {
				case <-ctx.Done():
					return
				case now := <-t.C:
					sample(now.Sub(start))
				}
			}
		}()
		res, err := Run(context.Background(), cfg)
		stop()
		<-done
		if err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		sample(-1)
		var out bytes.Buffer
		writeSoak(&out, samples)
		out.WriteString("\n")
		if err := res.WriteTable(&out); err != nil {
			b.Fatal(err)
		}
		fmt.Print(out.String())
		first, last := samples[0], samples[len(samples)-1]
		b.ReportMetric(float64(last.goroutines-first.goroutines), "goroutines-left")
		b.ReportMetric(float64(last.openFiles-first.openFiles), "files-left")
		if first.rssBytes >= 0 {
			b.ReportMetric(float64(last.rssBytes-first.rssBytes)/(1<<20), "rss-growth-MiB")
		}
	}
}

func writeSoak(w *bytes.Buffer, samples []soakSample) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "time\tRSS MiB\tgoroutines\topen files\tqueued requests\tqueued prefill tokens\t")
	for _, s := range samples {
		at, mib := "after", "-"
		if s.at >= 0 {
			at = s.at.Round(time.Second).String()
		}
		if s.rssBytes >= 0 {
			mib = fmt.Sprintf("%.1f", float64(s.rssBytes)/(1<<20))
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.0f\t%.0f\t\n", at, mib, s.goroutines, s.openFiles, s.queued, s.queuedPrefills)
	}
	_ = tw.Flush()
}

// gauge sums the samples of the gauge family name over the registries.
func gauge(regs []*prometheus.Registry, name string) float64 {
	var sum float64
	for _, r := range regs {
		if r == nil {
			continue
		}
		mfs, err := r.Gather()
		if err != nil {
			continue
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				for _, m := range mf.GetMetric() {
					sum += m.GetGauge().GetValue()
				}
			}
		}
	}
	return sum
}

// rss is the process's resident set in bytes, from /proc (-1 where there is none).
func rss() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			if f := strings.Fields(v); len(f) == 2 { // "123456 kB"
				if kb, err := strconv.ParseInt(f[0], 10, 64); err == nil {
					return kb << 10
				}
			}
		}
	}
	return -1
}

// openFiles counts the process's open descriptors, from /proc (-1 where there is none).
func openFiles() int {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(fds)
}
