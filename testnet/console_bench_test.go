//go:build unix

package testnet_test

import (
	"context"
	"io"
	"net/http"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/testnet"
)

// usage is the process's CPU time (user and system) and heap allocation count so far.
type usage struct {
	cpu     time.Duration
	mallocs uint64
	at      time.Time
}

func readUsage(tb testing.TB) usage {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return usage{cpu: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), mallocs: ms.Mallocs, at: time.Now()}
}

// perSecond is u's growth since from, per second of wall time: CPU in ms/s, mallocs/s.
func (u usage) perSecond(from usage) (cpuMS, mallocs float64) {
	s := u.at.Sub(from.at).Seconds()
	return float64(u.cpu-from.cpu) / float64(time.Millisecond) / s, float64(u.mallocs-from.mallocs) / s
}

// BenchmarkConsoleTestnet is what an open console costs a node of a light 64-node testnet
// (KVMESH_SCALE_NODES nodes; the mesh's own gossip runs throughout): the whole process's CPU
// time and heap allocations a second, over windows of KVMESH_SCALE_DURATION seconds (default
// 10) taken in turn without a console and with one polling node 0's /console/state once a
// second, as the page does; two windows of each. Reported:
//
//   - idle-cpu-ms/s, idle-mallocs/s: the windows without a console;
//   - console-cpu-ms/s, console-mallocs/s: the windows with one;
//   - get-cpu-ms, get-mallocs: one GET of the state end to end (client and server, loopback
//     HTTP), from 200 back to back within one build interval, so each is served from the
//     state built for the first: the HTTP share of a poll, apart from the build
//     (node's BenchmarkConsoleState).
//
// The process holds every node, so idle figures are the mesh's, not one node's.
//
// go test -run '^$' -bench ConsoleTestnet -benchtime 1x -timeout 20m ./testnet/
func BenchmarkConsoleTestnet(b *testing.B) {
	nodes := int(scaleEnv("NODES", 64))
	window := time.Duration(scaleEnv("DURATION", 10) * float64(time.Second))
	for b.Loop() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		tn, err := testnet.Start(ctx, testnet.Config{Nodes: nodes, Light: true})
		if err != nil {
			b.Fatal(err)
		}
		if err := tn.WaitConverged(ctx); err != nil {
			b.Fatal(err)
		}
		state := tn.URLs()[0] + "/console/state"
		get(b, state) // the first build, and a warm connection
		var idleCPU, idleMallocs, conCPU, conMallocs float64
		for range 2 {
			c, m := consoleWindow(b, "", window)
			idleCPU, idleMallocs = idleCPU+c/2, idleMallocs+m/2
			c, m = consoleWindow(b, state, window)
			conCPU, conMallocs = conCPU+c/2, conMallocs+m/2
		}
		b.ReportMetric(idleCPU, "idle-cpu-ms/s")
		b.ReportMetric(idleMallocs, "idle-mallocs/s")
		b.ReportMetric(conCPU, "console-cpu-ms/s")
		b.ReportMetric(conMallocs, "console-mallocs/s")
		const gets = 200
		from := readUsage(b)
		for range gets {
			get(b, state)
		}
		to := readUsage(b)
		b.ReportMetric(float64(to.cpu-from.cpu)/float64(time.Millisecond)/gets, "get-cpu-ms")
		b.ReportMetric(float64(to.mallocs-from.mallocs)/gets, "get-mallocs")
		if err := tn.Close(); err != nil {
			b.Fatal(err)
		}
		cancel()
	}
}

// consoleWindow measures the process over window, polling url once a second unless url is "".
func consoleWindow(b *testing.B, url string, window time.Duration) (cpuMS, mallocs float64) {
	b.Helper()
	from := readUsage(b)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for end := time.Now().Add(window); time.Now().Before(end); <-tick.C {
		if url != "" {
			get(b, url)
		}
	}
	return readUsage(b).perSecond(from)
}

func get(b *testing.B, url string) {
	b.Helper()
	resp, err := http.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
}
