package bench

import (
	"testing"

	"github.com/kvmesh/kvmesh/testnet"
	"github.com/kvmesh/kvmesh/testnet/loadgen"
)

// TestPathCounterAttribution pins each completed request's path (a mixed node's, a decode node's
// run whole, a decode node's after a prefill node's handover), its class's samples in simulated
// time, and that refusals and failures take no path.
func TestPathCounterAttribution(t *testing.T) {
	pc := newPathCounter([]string{"prefill", "decode", ""}, 2) // node 1 decodes, node 2 is mixed
	p, d, m := testnet.Name(0), testnet.Name(1), testnet.Name(2)
	rec := func(node, prefill, class string, tpot, gap float64, met bool) loadgen.RequestRecord {
		return loadgen.RequestRecord{Outcome: "completed", Node: node, PrefillNode: prefill, Class: class,
			OutputTokens: 100, TTFTS: 0.5, TPOTS: tpot, MaxITLS: gap, MetSLO: met}
	}
	for _, r := range []loadgen.RequestRecord{
		rec(d, p, "interactive", 0.010, 0.012, true),
		rec(d, p, "interactive", 0.020, 0.030, false),
		rec(d, "", "interactive", 0.030, 0.040, true),
		rec(m, "", "batch", 0.040, 0.050, true),
		{Outcome: "refused", Node: d, Class: "interactive"},
		{Outcome: "failed", Class: "interactive"},
		{Outcome: "completed", Node: d, PrefillNode: p, Class: "interactive", OutputTokens: 1, TTFTS: 1},
	} {
		pc.observe(r)
	}
	got := pc.latencies([]string{"interactive", "batch"})
	want := []struct {
		path, class     string
		completed, good int
		tpotP99, gapP50 float64
	}{
		{PathMixed, "batch", 1, 1, 0.080, 0.100},
		{PathDecodeWhole, "interactive", 1, 1, 0.060, 0.080},
		{PathSplit, "interactive", 3, 1, 0.040, 0.024},
	}
	if len(got) != len(want) {
		t.Fatalf("paths %+v, want %d", got, len(want))
	}
	for i, w := range want {
		g := got[i]
		if g.Path != w.path || g.Class != w.class || g.Completed != w.completed || g.Good != w.good ||
			g.TPOT.P99 != w.tpotP99 || g.MaxITL.P50 != w.gapP50 || g.TTFT.P50 != 1.0 {
			t.Errorf("path %d: %+v, want %+v", i, g, w)
		}
	}
	if s := got[2]; s.TPOT.Count != 2 || s.TTFT.Count != 3 || s.TTFT.Max != 2.0 {
		t.Errorf("split: TPOT of %d requests, TTFT of %d, max %v; want the one-token reply's TTFT alone (2 s simulated)", s.TPOT.Count, s.TTFT.Count, s.TTFT.Max)
	}
}
