package bench

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/testnet/loadgen"
)

// TestLRUOracle pins the oracle's cache: a hit is the run of blocks cached from block 0, a
// chain is cached whole after its request, the least recently used block goes first, and of
// one chain its tail goes before its head.
func TestLRUOracle(t *testing.T) {
	o := newLRUOracle(6)
	// The cache's order, most recent first, after each step.
	steps := []struct {
		chain []uint64
		hit   int
	}{
		{[]uint64{1, 2, 3}, 0},     // 1 2 3
		{[]uint64{1, 2, 3}, 3},     // 1 2 3
		{[]uint64{1, 2, 9}, 2},     // 1 2 9 3
		{[]uint64{5, 2, 3}, 0},     // a hit starts at block 0: 5 2 3 1 9
		{[]uint64{7, 8}, 0},        // full: 7 8 5 2 3 1, chain 1 2 9 lost its tail, not its head
		{[]uint64{1, 2, 9}, 2},     // 1 2 9 7 8 5
		{[]uint64{4, 6, 10}, 0},    // 4 6 10 1 2 9
		{[]uint64{1, 2, 9, 11}, 3}, // 1 2 9 11 4 6
		{[]uint64{7, 8}, 0},        // 7 and 8 were the least recently used
	}
	for i, s := range steps {
		if got := o.request(s.chain); got != s.hit {
			t.Fatalf("step %d: chain %v hit %d blocks, want %d", i, s.chain, got, s.hit)
		}
		if o.order.Len() > o.capacity || len(o.at) != o.order.Len() {
			t.Fatalf("step %d: %d blocks cached, %d indexed, capacity %d", i, o.order.Len(), len(o.at), o.capacity)
		}
	}
}

// TestOracleHitRatios checks the oracle on the shared-prefix workload: a cache that holds every
// tenant's system prompt hits about their share of the prompts, a cache of one system prompt
// almost nothing, and a warm-up raises the first load's ratio.
func TestOracleHitRatios(t *testing.T) {
	sp := loadgen.SharedPrefix{Tenants: 20, SystemTokens: 1000, QuestionTokens: 100, ReplyTokens: 100}
	ratios := func(kvBlocks int, warmup time.Duration) []float64 {
		t.Helper()
		cfg := Config{Nodes: 2, KVBlocks: kvBlocks, Workload: "shared-prefix", SharedPrefix: sp, Loads: []float64{1, 2},
			Duration: 10 * time.Second, Warmup: warmup, Seed: 2}
		cfg, err := cfg.validate()
		if err != nil {
			t.Fatal(err)
		}
		r, err := (&bencher{cfg: cfg}).oracleHitRatios(10)
		if err != nil || len(r) != 2 {
			t.Fatalf("oracleHitRatios: %v, %v", r, err)
		}
		return r
	}
	big, small, cold := ratios(100000, 5*time.Second), ratios(40, 5*time.Second), ratios(100000, 0)
	for i := range big {
		// Shares of the prompt: ~1000 system tokens of ~1100.
		if big[i] < 0.7 || big[i] > 0.95 || small[i] > 0.05 {
			t.Errorf("load %d: hit ratio %.3f with room for every tenant, %.3f with room for 80 blocks", i, big[i], small[i])
		}
	}
	if cold[0] >= big[0] || cold[1] > big[1] {
		t.Errorf("warm-up did not raise the hit ratio: cold %v, warm %v", cold, big)
	}
	if r, err := (&bencher{cfg: Config{Workload: "agents"}}).oracleHitRatios(10); r != nil || err != nil {
		t.Errorf("agents: %v, %v; want no oracle", r, err)
	}
}

// TestBounds checks the ideal admission's bound: the run's good requests go to the classes in
// priority order, each up to what it sent.
func TestBounds(t *testing.T) {
	report := func(good, iSent, iGood, bSent, bGood int) *loadgen.Report {
		return &loadgen.Report{Good: good, Classes: map[string]*loadgen.ClassReport{
			"batch":       {Name: "batch", Priority: -1, GroupReport: loadgen.GroupReport{Sent: bSent, Good: bGood, Attainment: frac(bGood, bSent)}},
			"interactive": {Name: "interactive", Priority: 0, GroupReport: loadgen.GroupReport{Sent: iSent, Good: iGood, Attainment: frac(iGood, iSent)}},
		}}
	}
	for _, c := range []struct {
		name          string
		rep           *loadgen.Report
		bounds, ratio [2]float64
	}{
		{"enough for interactive", report(80, 70, 50, 50, 30), [2]float64{1, 0.2}, [2]float64{50.0 / 70, 3}},
		{"short of interactive", report(35, 70, 20, 50, 15), [2]float64{0.5, 0}, [2]float64{20.0 / 35, 0}},
		{"all served", report(120, 70, 70, 50, 50), [2]float64{1, 1}, [2]float64{1, 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := Bounds(c.rep, nil)
			if len(b) != 2 || b[0].Class != "interactive" || b[1].Class != "batch" {
				t.Fatalf("bounds %+v: want interactive then batch", b)
			}
			for i := range b {
				if !near(b[i].Bound, c.bounds[i]) || !near(b[i].Ratio, c.ratio[i]) {
					t.Errorf("%s: bound %.3f ratio %.3f, want %.3f, %.3f", b[i].Class, b[i].Bound, b[i].Ratio, c.bounds[i], c.ratio[i])
				}
			}
			r := newRow("kvmesh", 1, c.rep, nil, 1, "interactive")
			if !near(r.HighBound, c.bounds[0]) || !near(r.HighBoundRatio, c.ratio[0]) {
				t.Errorf("row's interactive bound %.3f ratio %.3f", r.HighBound, r.HighBoundRatio)
			}
			var table strings.Builder
			if err := (&Result{Interactive: "interactive", Rows: []Row{r}}).WriteTable(&table); err != nil {
				t.Fatal(err)
			}
			// A class with no bound has no ratio, not a ratio of 0.
			ratio := fmt.Sprintf("%.2f", c.ratio[1])
			if c.bounds[1] == 0 {
				ratio = "-"
			}
			batch := regexp.MustCompile(fmt.Sprintf(`batch +%d +%d +%s +%s +%s\n`, b[1].Sent, b[1].Good,
				regexp.QuoteMeta(pct(b[1].Attainment)), regexp.QuoteMeta(pct(c.bounds[1])), regexp.QuoteMeta(ratio)))
			if !batch.MatchString(table.String()) {
				t.Errorf("table lacks %s:\n%s", batch, table.String())
			}
		})
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }
