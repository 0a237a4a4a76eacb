package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet/loadgen"
)

func TestModelTargets(t *testing.T) {
	urls := []string{"u0", "u1", "u2", "u3", "u4"}
	if got := modelTargets(urls, 1); got != nil {
		t.Errorf("one model: %v, want none", got)
	}
	got := modelTargets(urls, 2)
	if len(got) != 2 || got[0].Name != ModelName(0) || got[1].Name != ModelName(1) || got[0].Name == got[1].Name ||
		strings.Join(got[0].Targets, ",") != "u0,u2,u4" || strings.Join(got[1].Targets, ",") != "u1,u3" {
		t.Errorf("two models over five nodes: %+v, want node i serving model i mod 2", got)
	}
}

func TestEntryRows(t *testing.T) {
	rep := &loadgen.Report{Entries: map[string]*loadgen.GroupReport{
		loadgen.EntryOwn:   {Sent: 10, Good: 8, Goodput: 4, Attainment: 0.8, CachedRatio: 0.5, TTFT: loadgen.Percentiles{P50: 0.1}},
		loadgen.EntryOther: {Sent: 10, Good: 6, Goodput: 3, Attainment: 0.6, CachedRatio: 0.4, TTFT: loadgen.Percentiles{P50: 0.15}},
	}}
	rows, cmp := entryRows(rep, 2)
	if rows[loadgen.EntryOwn].GoodputRPS != 2 || rows[loadgen.EntryOther].P50TTFT != 0.3 {
		t.Errorf("rows %+v %+v not in simulated time", rows[loadgen.EntryOwn], rows[loadgen.EntryOther])
	}
	near := func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }
	if cmp == nil || !near(cmp.HitRatio, 0.8) || !near(cmp.Attainment, 0.75) || !near(cmp.Goodput, 0.75) || !near(cmp.AddedP50TTFT, 0.1) {
		t.Errorf("comparison %+v, want hit 0.8, attainment and goodput 0.75, 0.1 s added", cmp)
	}
	if rows, cmp := entryRows(&loadgen.Report{}, 1); rows != nil || cmp != nil {
		t.Errorf("one model: %v %v", rows, cmp)
	}
}

// TestRunModels runs a short multi-model benchmark: node i serves model i mod 2, each run's
// requests ask for both models and enter through both kinds of node, every row compares the
// two entries, and the no-delegate policy's nodes run with route.delegate off.
func TestRunModels(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two testnets")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	cfg := Config{
		Nodes: 4, Models: 2, TimeScale: 20, Workload: "shared-prefix", Loads: []float64{1}, Capacity: 4,
		Duration: 1500 * time.Millisecond, Seed: 3, Logger: slog.New(slog.DiscardHandler),
	}
	var mu sync.Mutex
	served := map[string][]string{} // model → nodes, as configured
	delegates := map[bool]int{}     // route.delegate on → nodes
	cfg.Configure = func(i int, c *node.Config) {
		mu.Lock()
		defer mu.Unlock()
		served[strings.Join(c.Models, ",")] = append(served[strings.Join(c.Models, ",")], c.Name)
		delegates[c.Route.Delegates()]++
	}
	var records bytes.Buffer
	cfg.Requests = &records
	res, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(served[ModelName(0)]) != 4 || len(served[ModelName(1)]) != 4 || delegates[true] != 4 || delegates[false] != 4 {
		t.Errorf("nodes by model %v (two testnets of two nodes each), by delegation %v", served, delegates)
	}
	if len(res.Rows) != 2 || res.Rows[0].Policy != KvmeshPolicy || res.Rows[1].Policy != NoDelegatePolicy || res.Models != 2 {
		t.Fatalf("%d rows, models %d", len(res.Rows), res.Models)
	}
	for _, row := range res.Rows {
		own, other := row.Entries[loadgen.EntryOwn], row.Entries[loadgen.EntryOther]
		if own == nil || other == nil || own.Sent+other.Sent != row.Sent || own.Sent == 0 || other.Sent == 0 || row.OtherOverOwn == nil {
			t.Errorf("%s: entries %+v of %d sent, comparison %v", row.Policy, row.Entries, row.Sent, row.OtherOverOwn)
		}
		if row.Completed == 0 || row.OracleHitRatio != nil {
			t.Errorf("%s: %d completed, oracle %v (none for several models)", row.Policy, row.Completed, row.OracleHitRatio)
		}
	}
	// The requests entering through another model's node are handed to a delegate under
	// kvmesh (a delegate that did not answer leaves one to the ingress: fallback), but for
	// those the ingress ends first (a budget refusal, a client gone); none without delegation.
	km, nd := res.Rows[0], res.Rows[1]
	d := km.Delegated
	if other := km.Entries[loadgen.EntryOther]; other == nil || d["delegated"] == 0 || d["delegated"]+d["fallback"]+d["no_delegate"] > other.Sent || d["served"] < d["delegated"] {
		t.Errorf("kvmesh: delegations %v, want each of the %+v requests entering through another model's node", km.Delegated, km.Entries[loadgen.EntryOther])
	}
	if nd.Delegated["delegated"] != 0 || nd.Delegated["served"] != 0 {
		t.Errorf("%s: delegations %v, want none", NoDelegatePolicy, nd.Delegated)
	}
	models := map[string]int{}
	for dec := json.NewDecoder(&records); dec.More(); {
		var r loadgen.RequestRecord
		if err := dec.Decode(&r); err != nil {
			t.Fatal(err)
		}
		if r.Outcome == "completed" {
			models[r.Model]++
		}
	}
	if models[ModelName(0)] == 0 || models[ModelName(1)] == 0 || len(models) != 2 {
		t.Errorf("completed requests by model %v, want both models", models)
	}
	var table, js bytes.Buffer
	if err := res.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"2 models over 4 nodes", "other/own: hit", "p50 TTFT added", NoDelegatePolicy} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	if err := res.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Result
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.Models != 2 || back.Rows[0].OtherOverOwn == nil || back.Rows[1].Entries[loadgen.EntryOther] == nil {
		t.Errorf("JSON does not carry the entries: %v", err)
	}
}
