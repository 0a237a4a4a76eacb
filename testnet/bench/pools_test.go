package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet/loadgen"
)

// TestPoolCounterAttribution pins which pool each request counts in, and when: nodes n1 and
// n2 are prefill and decode, n3 mixed; time scale 2 doubles every second. A request the
// decode node answered is split only when it names its prefill node; else it ran whole there.
func TestPoolCounterAttribution(t *testing.T) {
	pc := newPoolCounter([]string{"prefill", "decode"}, 3, 2)
	for _, r := range []loadgen.RequestRecord{
		{Outcome: "completed", Node: "n2", PrefillNode: "n1", EndS: 3, E2ES: 2.5, TTFTS: 1}, // split: prefill at 1 s, decode at 3 s
		{Outcome: "failed", Node: "n3", EndS: 2, E2ES: 1},                                   // whole on mixed, at 2 s
		{Outcome: "completed", Node: "n2", EndS: 1.8, E2ES: 1.2, TTFTS: 0.5},                // whole on the decode node: mixed, at 1 s
		{Outcome: "refused", Reason: "decode_unavailable", EndS: 1.6, E2ES: 1},              // prefill at 1 s, decode refused at 3 s
		{Outcome: "refused", Reason: "slo_unattainable", EndS: 0.2, E2ES: 0.1},              // refused before the prefill, at 0 s
		{Outcome: "failed", Failure: "transport", EndS: 1, E2ES: 1},                         // no answer: no pool
		{Outcome: "completed", Node: "n9", EndS: 1, E2ES: 1},                                // an unknown node: no pool
	} {
		pc.observe(r)
	}
	got, corr := pc.timelines(4)
	want := map[string]PoolTimeline{
		PoolPrefill: {Accepted: 2, Refused: 1, AcceptedPerSecond: []int{0, 2, 0, 0}, RefusedPerSecond: []int{1, 0, 0, 0}},
		PoolDecode:  {Accepted: 1, Refused: 1, AcceptedPerSecond: []int{0, 0, 0, 1}, RefusedPerSecond: []int{0, 0, 0, 1}},
		PoolMixed:   {Accepted: 2, AcceptedPerSecond: []int{0, 1, 1, 0}, RefusedPerSecond: []int{0, 0, 0, 0}},
	}
	if len(got) != len(want) {
		t.Fatalf("pools %v, want %v", got, want)
	}
	for name, w := range want {
		g := got[name]
		if g == nil || g.Accepted != w.Accepted || g.Refused != w.Refused ||
			!slices.Equal(g.AcceptedPerSecond, w.AcceptedPerSecond) || !slices.Equal(g.RefusedPerSecond, w.RefusedPerSecond) {
			t.Errorf("pool %s: %+v, want %+v", name, g, w)
		}
	}
	if corr == nil || math.Abs(*corr-(-1.0/3)) > 1e-9 { // prefill 0,2,0,0 against decode 0,0,0,1
		t.Errorf("correlation %v, want -1/3", corr)
	}
	if cv := got[PoolMixed].AcceptedCV; math.Abs(cv-1) > 1e-9 { // one in each of two of four seconds
		t.Errorf("mixed CV %v, want 1", cv)
	}

	// A mesh of mixed nodes: refusals before any engine are the mixed pool's, and no
	// correlation is reported.
	mixed := newPoolCounter(nil, 2, 1)
	mixed.observe(loadgen.RequestRecord{Outcome: "refused", Reason: "queue_full", EndS: 0.5, E2ES: 0.1})
	mixed.observe(loadgen.RequestRecord{Outcome: "completed", Node: "n1", EndS: 0.5, E2ES: 0.1})
	got, corr = mixed.timelines(1)
	if len(got) != 1 || got[PoolMixed].Refused != 1 || got[PoolMixed].Accepted != 1 || corr != nil {
		t.Errorf("mixed mesh: %v, correlation %v", got, corr)
	}
}

func TestCorrelation(t *testing.T) {
	tests := []struct {
		a, b []int
		want float64
		ok   bool
	}{
		{[]int{1, 2, 3}, []int{2, 4, 6}, 1, true},
		{[]int{1, 0, 1, 0}, []int{0, 1, 0, 1}, -1, true}, // anti-phase
		{[]int{1, 1, 1}, []int{0, 1, 2}, 0, false},       // a constant pool
		{[]int{1, 2, 3, 9}, []int{3, 2, 1}, -1, true},    // over the common length
	}
	for _, tt := range tests {
		got, ok := correlation(tt.a, tt.b)
		if ok != tt.ok || math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("correlation(%v, %v) = %v, %v; want %v, %v", tt.a, tt.b, got, ok, tt.want, tt.ok)
		}
	}
}

func TestParseOutcomes(t *testing.T) {
	text := `# TYPE kvmesh_route_disaggregated_total counter
kvmesh_route_disaggregated_total{outcome="split"} 7
kvmesh_route_disaggregated_total{outcome="whole_short"} 2
kvmesh_route_disaggregated_total{outcome="whole_mixed"} 1
kvmesh_route_disaggregated_total{outcome="handover"} 7
kvmesh_route_disaggregated_totally{outcome="split"} 100
`
	sum := map[string]int{"split": 1}
	if err := parseOutcomes(strings.NewReader(text), disaggMetric, sum); err != nil {
		t.Fatal(err)
	}
	if split, whole := splitWhole(sum); split != 8 || whole != 3 || sum["handover"] != 7 {
		t.Errorf("sum %v: split %d whole %d, want 8 and 3", sum, split, whole)
	}
	if err := parseOutcomes(strings.NewReader(disaggMetric+`{outcome="split"} x`), disaggMetric, map[string]int{}); err == nil {
		t.Error("a malformed value parsed")
	}
}

// TestRunDisaggregated runs the disaggregated benchmark in miniature: kvmesh on two mixed nodes
// and on a prefill and a decode node, one load, about a second each, and checks its structure.
func TestRunDisaggregated(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two testnets")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	cfg := Config{
		Disaggregated: []string{"prefill", "decode"}, TimeScale: 20, Workload: "chat", Loads: []float64{1},
		Capacity: 2, Duration: 1500 * time.Millisecond, Seed: 3, Logger: slog.New(slog.DiscardHandler),
		BatchedTokens: 1536, DecodeBatchedTokens: 512,
	}
	budgets := map[string][]int{} // each role's nodes' step budgets, as the bench configured them
	var mu sync.Mutex
	cfg.Configure = func(_ int, c *node.Config) {
		// The decode node runs halves only, so that the chat's short prompts are split: each
		// names its prefill node, and counts in the prefill and decode pools (poolCounter).
		c.Route.DecodeLocalPrefill = new(bool)
		mu.Lock()
		budgets[c.Role] = append(budgets[c.Role], c.Sim.MaxNumBatchedTokens)
		mu.Unlock()
	}
	var progress bytes.Buffer
	cfg.Progress = &progress
	res, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("Run: %v\nprogress:\n%s", err, progress.String())
	}
	if len(res.Rows) != 2 || res.Rows[0].Policy != KvmeshPolicy || res.Rows[1].Policy != DisaggPolicy || res.Nodes != 2 {
		t.Fatalf("rows %v on %d nodes, want kvmesh then %s on 2", len(res.Rows), res.Nodes, DisaggPolicy)
	}
	for _, row := range res.Rows {
		if row.Sent == 0 || row.Sent != row.Completed+row.Refused+row.Failed {
			t.Errorf("%s: sent %d != completed %d + refused %d + failed %d", row.Policy, row.Sent, row.Completed, row.Refused, row.Failed)
		}
		if row.Completed == 0 || row.P50TTFT <= 0 || row.P50TTFT > row.P99TTFT || row.HighP99TPOT <= 0 {
			t.Errorf("%s: completed %d, TTFT p50 %v p99 %v, interactive TPOT p99 %v", row.Policy, row.Completed, row.P50TTFT, row.P99TTFT, row.HighP99TPOT)
		}
	}
	if want := map[string][]int{"": {1536, 1536}, "prefill": {1536}, "decode": {512}}; !reflect.DeepEqual(budgets, want) {
		t.Errorf("step budgets by role %v, want %v: every engine takes BatchedTokens, the disaggregated run's decode node DecodeBatchedTokens", budgets, want)
	}
	mixed, dis := res.Rows[0], res.Rows[1]
	if mixed.Split != 0 || mixed.Whole != 0 || dis.Split == 0 {
		t.Errorf("split/whole: mixed %d/%d, disaggregated %d/%d; want none on mixed nodes and splits on roles",
			mixed.Split, mixed.Whole, dis.Split, dis.Whole)
	}
	if m := mixed.Pools[PoolMixed]; len(mixed.Pools) != 1 || m == nil || m.Accepted+m.Refused == 0 {
		t.Errorf("mixed run's pools %v, want the mixed pool alone", mixed.Pools)
	}
	p, d := dis.Pools[PoolPrefill], dis.Pools[PoolDecode]
	if p == nil || d == nil || p.Accepted == 0 || d.Accepted == 0 || dis.Pools[PoolMixed] != nil {
		t.Fatalf("disaggregated run's pools %v, want prefill and decode with accepted requests", dis.Pools)
	}
	if len(p.AcceptedPerSecond) == 0 || len(p.AcceptedPerSecond) != len(d.AcceptedPerSecond) || len(d.RefusedPerSecond) != len(d.AcceptedPerSecond) {
		t.Errorf("timelines of %d and %d seconds", len(p.AcceptedPerSecond), len(d.AcceptedPerSecond))
	}
	// Every completed split request was accepted by both pools.
	if d.Accepted < dis.Completed || p.Accepted < d.Accepted {
		t.Errorf("accepted: prefill %d, decode %d, completed %d", p.Accepted, d.Accepted, dis.Completed)
	}

	for _, row := range res.Rows {
		n := 0
		for _, l := range row.Paths {
			n += l.Completed
			if l.Path != PathMixed && row.Policy == KvmeshPolicy || l.Path == PathMixed && row.Policy == DisaggPolicy {
				t.Errorf("%s: path %s", row.Policy, l.Path)
			}
		}
		if n != row.Completed {
			t.Errorf("%s: paths hold %d completed requests of %d", row.Policy, n, row.Completed)
		}
	}
	if !slices.ContainsFunc(dis.Paths, func(l PathLatency) bool { return l.Path == PathSplit && l.TPOT.P99 > 0 }) {
		t.Errorf("disaggregated run's paths %+v, want split requests with a TPOT", dis.Paths)
	}

	var table, js, svg bytes.Buffer
	if err := res.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + table.String())
	for _, want := range []string{"kvmesh-disagg: nodes prefill,decode, KV link 25 GB/s, decode nodes' step budget 512 tokens", "engines' step budget 1536 tokens", "corr(prefill, decode)", "prefill ", "p50 TTFT", "longest gap"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	if !regexp.MustCompile(`(?m)^kvmesh-disagg +1 +split +interactive +\d+`).MatchString(table.String()) {
		t.Errorf("table has no row of the split requests' latency:\n%s", table.String())
	}
	if err := res.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Result
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.Rows[1].Pools[PoolDecode] == nil || back.Rows[1].Split != dis.Split {
		t.Errorf("JSON does not carry the pools and splits: %v", err)
	}
	if err := res.WritePoolSVG(&svg); err != nil {
		t.Fatal(err)
	}
	checkXML(t, svg.Bytes())
	for _, want := range []string{"prefill accepted", "decode refused", "mixed accepted", DisaggPolicy + " at 1× capacity"} {
		if !strings.Contains(svg.String(), want) {
			t.Errorf("pool plot lacks %q", want)
		}
	}
}
