package bench

import (
	"fmt"
	"slices"
	"sync"

	"github.com/kvmesh/kvmesh/testnet"
	"github.com/kvmesh/kvmesh/testnet/loadgen"
)

// Paths a completed request took through a mesh, by the node that answered it: a mixed node
// ran it whole, a decode node ran it whole (route.decode_local_prefill), or a decode node
// decoded it after a prefill node's handover.
const (
	PathMixed       = "mixed"
	PathDecodeWhole = "decode-whole"
	PathSplit       = "split"
)

// pathOrder is the paths' order in Row.Paths and the table.
var pathOrder = []string{PathMixed, PathDecodeWhole, PathSplit}

// PathLatency is the latency of one class's completed requests that took one path, in
// simulated seconds: whether a split's decode keeps the TPOT a mixed step's prefill chunk
// takes away is read here. TPOT is each request's mean gap ((E2E − TTFT)/(tokens − 1)), MaxITL
// its longest one, the step a prefill chunk stretched.
type PathLatency struct {
	Path      string              `json:"path"`
	Class     string              `json:"class"`
	Completed int                 `json:"completed"`
	Good      int                 `json:"good"`
	TTFT      loadgen.Percentiles `json:"ttft"`
	TPOT      loadgen.Percentiles `json:"tpot"`
	MaxITL    loadgen.Percentiles `json:"max_itl"`
}

// pathCounter gathers completed requests' latencies by path and class; safe for concurrent
// use.
type pathCounter struct {
	decode    map[string]bool // node name → a decode node
	timeScale float64
	mu        sync.Mutex
	by        map[[2]string]*pathSamples // (path, class)
}

type pathSamples struct {
	good              int
	ttft, tpot, maxIT []float64
}

func newPathCounter(roles []string, timeScale float64) *pathCounter {
	pc := &pathCounter{decode: map[string]bool{}, timeScale: timeScale, by: map[[2]string]*pathSamples{}}
	for i, r := range roles {
		if r == PoolDecode {
			pc.decode[testnet.Name(i)] = true
		}
	}
	return pc
}

// observe counts one request's record (loadgen.Config.Observe); refused and failed requests
// took no path.
func (pc *pathCounter) observe(r loadgen.RequestRecord) {
	if r.Outcome != "completed" {
		return
	}
	path := PathMixed
	switch {
	case pc.decode[r.Node] && r.PrefillNode != "":
		path = PathSplit
	case pc.decode[r.Node]:
		path = PathDecodeWhole
	}
	s := pc.timeScale
	pc.mu.Lock()
	defer pc.mu.Unlock()
	k := [2]string{path, r.Class}
	ps := pc.by[k]
	if ps == nil {
		ps = &pathSamples{}
		pc.by[k] = ps
	}
	if r.MetSLO {
		ps.good++
	}
	ps.ttft = append(ps.ttft, r.TTFTS*s)
	if r.OutputTokens >= 2 {
		ps.tpot = append(ps.tpot, r.TPOTS*s)
		ps.maxIT = append(ps.maxIT, r.MaxITLS*s)
	}
}

// latencies returns the paths' latencies, by path in pathOrder then class in classes' order.
func (pc *pathCounter) latencies(classes []string) []PathLatency {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	var out []PathLatency
	for _, path := range pathOrder {
		for _, class := range classes {
			ps := pc.by[[2]string{path, class}]
			if ps == nil {
				continue
			}
			out = append(out, PathLatency{Path: path, Class: class, Completed: len(ps.ttft), Good: ps.good,
				TTFT: loadgen.Summary(ps.ttft), TPOT: loadgen.Summary(ps.tpot), MaxITL: loadgen.Summary(ps.maxIT)})
		}
	}
	return out
}

// writePaths prints the rows' per-path latencies, when any row has them.
func writePaths(rows []Row, p func(string, ...any)) {
	if !slices.ContainsFunc(rows, func(r Row) bool { return len(r.Paths) > 0 }) {
		return
	}
	p("\npolicy\tload\tpath\tclass\tcompleted\tgood\tp50 / p99 TTFT s\tp50 / p99 TPOT ms\tp50 / p99 longest gap ms\n")
	for _, row := range rows {
		for _, l := range row.Paths {
			p("%s\t%.2g\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", row.Policy, row.Load, l.Path, l.Class, l.Completed, l.Good,
				fmt.Sprintf("%.2f / %.2f", l.TTFT.P50, l.TTFT.P99), fmt.Sprintf("%.1f / %.1f", 1000*l.TPOT.P50, 1000*l.TPOT.P99),
				fmt.Sprintf("%.1f / %.1f", 1000*l.MaxITL.P50, 1000*l.MaxITL.P99))
		}
	}
}
