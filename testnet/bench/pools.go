package bench

import (
	"context"
	"io"
	"math"
	"strings"
	"sync"

	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet"
	"github.com/kvmesh/kvmesh/testnet/loadgen"
)

// Pools of a run's per-pool timeline: the nodes of one role; the mixed pool is the whole
// requests', those a decode node ran whole included (poolCounter).
const (
	PoolPrefill = route.RolePrefill
	PoolDecode  = route.RoleDecode
	PoolMixed   = route.RoleMixed
)

// poolOrder is the pools' order in the table and the plot.
var poolOrder = []string{PoolPrefill, PoolDecode, PoolMixed}

// PoolTimeline is what one pool accepted and refused in a run, as the load generator saw it
// (see poolCounter for how a request is attributed). Seconds are simulated, from the run's
// start; the per-second slices run to its last request's end.
type PoolTimeline struct {
	Accepted          int   `json:"accepted"`
	Refused           int   `json:"refused"`
	AcceptedPerSecond []int `json:"accepted_per_s"`
	RefusedPerSecond  []int `json:"refused_per_s"`
	// AcceptedCV is the coefficient of variation of AcceptedPerSecond over the arrival window:
	// near the arrivals' own when the pool keeps pace, larger when it takes work in bursts.
	AcceptedCV float64 `json:"accepted_cv"`
}

// poolCounter attributes each request of a run to pools as it ends; safe for concurrent use.
//
// The load generator sees which node answered a request (X-Kvmesh-Node), which node ran a split
// request's prefill half (X-Kvmesh-Prefill-Node, which a request run whole never has) and why
// one was refused, so:
//   - a request answered by a mixed node was accepted by the mixed pool when it arrived;
//   - one answered by a decode node with a prefill node was split: the prefill pool accepted it
//     when it arrived and the decode pool at its first token;
//   - one answered by a decode node without one ran whole there (route.decode_local_prefill):
//     the mixed pool, whole requests', accepted it when it arrived;
//   - a refusal after the prefill (decode_unavailable, decode_failed) was accepted by the
//     prefill pool and refused by the decode pool;
//   - any other refusal was refused by the pool the request enters first: prefill in a mesh
//     with prefill nodes, mixed otherwise (in a mesh of both, a short prompt refused whole is
//     counted as prefill);
//   - a request that failed without an answer is in no pool.
type poolCounter struct {
	nodes     map[string]string // node name → pool
	entry     string            // the pool a refusal before any engine is counted in
	timeScale float64
	mu        sync.Mutex
	pools     map[string]*PoolTimeline
}

func newPoolCounter(roles []string, n int, timeScale float64) *poolCounter {
	pc := &poolCounter{nodes: map[string]string{}, entry: PoolMixed, timeScale: timeScale, pools: map[string]*PoolTimeline{}}
	for i := range n {
		pool := PoolMixed
		if i < len(roles) && route.IsHalf(roles[i]) {
			pool = roles[i]
		}
		pc.nodes[testnet.Name(i)] = pool
		if pool == PoolPrefill {
			pc.entry = PoolPrefill
		}
	}
	return pc
}

// observe counts one request's record (loadgen.Config.Observe).
func (pc *poolCounter) observe(r loadgen.RequestRecord) {
	s := pc.timeScale
	arrived, ended := (r.EndS-r.E2ES)*s, r.EndS*s
	pc.mu.Lock()
	defer pc.mu.Unlock()
	switch pool := pc.nodes[r.Node]; {
	case r.Outcome == "refused" && (r.Reason == node.CodeDecodeUnavailable || r.Reason == node.CodeDecodeFailed):
		pc.add(PoolPrefill, arrived, true)
		pc.add(PoolDecode, ended, false)
	case r.Outcome == "refused":
		pc.add(pc.entry, ended, false)
	case pool == PoolDecode && r.PrefillNode != "":
		pc.add(PoolPrefill, arrived, true)
		pc.add(PoolDecode, arrived+r.TTFTS*s, true)
	case pool == PoolDecode:
		pc.add(PoolMixed, arrived, true)
	case pool != "":
		pc.add(pool, arrived, true)
	}
}

func (pc *poolCounter) add(pool string, at float64, accepted bool) {
	t := pc.pools[pool]
	if t == nil {
		t = &PoolTimeline{}
		pc.pools[pool] = t
	}
	sec := max(0, int(at))
	for len(t.AcceptedPerSecond) <= sec {
		t.AcceptedPerSecond = append(t.AcceptedPerSecond, 0)
		t.RefusedPerSecond = append(t.RefusedPerSecond, 0)
	}
	if accepted {
		t.Accepted++
		t.AcceptedPerSecond[sec]++
	} else {
		t.Refused++
		t.RefusedPerSecond[sec]++
	}
}

// timelines returns the pools' timelines, padded to one length, with their CVs over the first
// window seconds, and the correlation of the prefill and decode pools' accepted counts over
// those seconds (nil unless both pools accepted work and varied).
func (pc *poolCounter) timelines(window int) (map[string]*PoolTimeline, *float64) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	n := 0
	for _, t := range pc.pools {
		n = max(n, len(t.AcceptedPerSecond))
	}
	out := map[string]*PoolTimeline{}
	for name, t := range pc.pools {
		c := *t
		for len(c.AcceptedPerSecond) < n {
			c.AcceptedPerSecond = append(c.AcceptedPerSecond, 0)
			c.RefusedPerSecond = append(c.RefusedPerSecond, 0)
		}
		c.AcceptedCV = cv(head(c.AcceptedPerSecond, window))
		out[name] = &c
	}
	p, d := out[PoolPrefill], out[PoolDecode]
	if p == nil || d == nil {
		return out, nil
	}
	r, ok := correlation(head(p.AcceptedPerSecond, window), head(d.AcceptedPerSecond, window))
	if !ok {
		return out, nil
	}
	return out, &r
}

func head(v []int, n int) []int { return v[:min(len(v), max(n, 0))] }

func meanStd(v []int) (mean, std float64) {
	if len(v) == 0 {
		return 0, 0
	}
	for _, x := range v {
		mean += float64(x)
	}
	mean /= float64(len(v))
	for _, x := range v {
		std += (float64(x) - mean) * (float64(x) - mean)
	}
	return mean, math.Sqrt(std / float64(len(v)))
}

// cv is the coefficient of variation of v (0 for an empty or all-zero v).
func cv(v []int) float64 {
	m, s := meanStd(v)
	if m == 0 {
		return 0
	}
	return s / m
}

// correlation is Pearson's r of a and b over their common length; false when either is
// constant there. −1 is anti-phase: one pool takes work while the other idles.
func correlation(a, b []int) (float64, bool) {
	n := min(len(a), len(b))
	a, b = a[:n], b[:n]
	ma, sa := meanStd(a)
	mb, sb := meanStd(b)
	if sa == 0 || sb == 0 {
		return 0, false
	}
	cov := 0.0
	for i := range n {
		cov += (float64(a[i]) - ma) * (float64(b[i]) - mb)
	}
	return cov / float64(n) / (sa * sb), true
}

// disaggMetric counts dispatches in a mesh with prefill or decode nodes by outcome: split,
// whole_* (why the request ran whole), then what became of split requests' halves.
const disaggMetric = "kvmesh_route_disaggregated_total"

// scrapeOutcomes sums metric by outcome over the nodes at urls, less before's counts when
// before is not nil. A mesh that never counts it gives an empty map.
func scrapeOutcomes(ctx context.Context, urls []string, metric string, before map[string]int) (map[string]int, error) {
	sum := map[string]int{}
	if err := scrapeEach(ctx, urls, func(r io.Reader) error { return parseOutcomes(r, metric, sum) }); err != nil {
		return nil, err
	}
	for k := range sum {
		sum[k] -= before[k]
	}
	return sum, nil
}

// parseOutcomes adds the samples of metric, by their outcome label, of a text exposition to sum.
func parseOutcomes(r io.Reader, metric string, sum map[string]int) error {
	return scanLines(r, func(line string) error {
		outcome, v, ok, err := sample(line, metric, "outcome")
		if ok && err == nil {
			sum[outcome] += int(v)
		}
		return err
	})
}

// splitWhole returns the split dispatches of outcome counts and those dispatched whole.
func splitWhole(by map[string]int) (split, whole int) {
	for k, v := range by {
		switch {
		case k == "split":
			split += v
		case strings.HasPrefix(k, "whole_"):
			whole += v
		}
	}
	return split, whole
}
