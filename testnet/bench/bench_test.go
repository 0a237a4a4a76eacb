package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/engine/sim"
	"github.com/kvmesh/kvmesh/testnet"
	"github.com/kvmesh/kvmesh/testnet/loadgen"
)

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		ok   bool
	}{
		{"zero takes defaults", func(c *Config) {}, true},
		{"default", func(c *Config) { *c = DefaultConfig() }, true},
		{"negative nodes", func(c *Config) { c.Nodes = -1 }, false},
		{"external engines", func(c *Config) { c.Engines = testnet.EnginesExternal }, true},
		{"unknown engines", func(c *Config) { c.Engines = "gpu" }, false},
		{"NaN time scale", func(c *Config) { c.TimeScale = math.NaN() }, false},
		{"scale above one", func(c *Config) { c.Scale = 1.5 }, false},
		{"zero load", func(c *Config) { c.Loads = []float64{0.5, 0} }, false},
		{"unknown workload", func(c *Config) { c.Workload = "nope" }, false},
		{"unknown route", func(c *Config) { c.Policies = []Policy{{Name: "x", Route: "nope", Admission: node.AdmissionNone}} }, false},
		{"unknown admission", func(c *Config) { c.Policies = []Policy{{Name: "x", Route: "round-robin", Admission: "nope"}} }, false},
		{"repeated policy", func(c *Config) {
			p, _ := PolicyByName("kvmesh")
			c.Policies = []Policy{p, p}
		}, false},
		{"batch fraction", func(c *Config) { c.TraceBatchFraction = 2 }, false},
		{"fcfs baselines", func(c *Config) { c.BaselineScheduling = sim.SchedulingFCFS }, true},
		{"unknown baseline scheduling", func(c *Config) { c.BaselineScheduling = "lifo" }, false},
		{"unknown engine scheduling", func(c *Config) {
			c.Policies = []Policy{{Name: "x", Route: "round-robin", Admission: node.AdmissionNone, EngineScheduling: "lifo"}}
		}, false},
		{"disaggregated", func(c *Config) { c.Disaggregated = []string{"prefill", "decode", "mixed"} }, true},
		{"disaggregated without decode", func(c *Config) { c.Disaggregated = []string{"prefill", "mixed"} }, false},
		{"disaggregated on other nodes", func(c *Config) { c.Nodes, c.Disaggregated = 4, []string{"prefill", "decode"} }, false},
		{"unknown role", func(c *Config) {
			c.Policies = []Policy{{Name: "x", Route: "kvmesh", Admission: node.AdmissionKvmesh, Roles: []string{"prefill", "gpu"}}}
		}, false},
		{"roles on external engines", func(c *Config) {
			c.Engines, c.Disaggregated = testnet.EnginesExternal, []string{"prefill", "decode"}
		}, false},
		{"negative link", func(c *Config) { c.LinkGBps = -1 }, false},
		{"negative warm-up", func(c *Config) { c.Warmup = -time.Second }, false},
		{"shared-prefix workload", func(c *Config) { c.Workload = "shared-prefix" }, true},
		{"two models", func(c *Config) { c.Models = 2 }, true},
		{"negative models", func(c *Config) { c.Models = -1 }, false},
		{"more models than nodes", func(c *Config) { c.Nodes, c.Models = 2, 3 }, false},
		{"models on disaggregated roles", func(c *Config) { c.Models, c.Disaggregated = 2, []string{"prefill", "decode"} }, false},
		{"interactive TPOT SLO", func(c *Config) {
			c.Interactive = loadgen.DefaultInteractive
			c.Interactive.TPOT = 50 * time.Millisecond
		}, true},
		{"zero TPOT SLO", func(c *Config) { c.Interactive = loadgen.DefaultInteractive; c.Interactive.TPOT = 0 }, false},
		{"negative TTFT SLO", func(c *Config) { c.Batch = loadgen.DefaultBatch; c.Batch.TTFT = -time.Second }, false},
		{"same class names", func(c *Config) { c.Batch.Name = c.Interactive.Name; c.Interactive.Name = "x"; c.Batch.Name = "x" }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cfg Config
			tt.edit(&cfg)
			got, err := cfg.validate()
			if tt.ok != (err == nil) {
				t.Fatalf("validate: err = %v, want ok %v", err, tt.ok)
			}
			if err != nil {
				if !errors.Is(err, ErrConfig) {
					t.Errorf("err %v does not wrap ErrConfig", err)
				}
				return
			}
			if len(cfg.Disaggregated) > 0 {
				names := []string{}
				for _, p := range got.Policies {
					names = append(names, p.Name)
				}
				if got.Nodes != len(cfg.Disaggregated) || fmt.Sprint(names) != fmt.Sprint([]string{KvmeshPolicy, DisaggPolicy}) ||
					!slices.Equal(got.Policies[1].Roles, cfg.Disaggregated) || got.Policies[0].Roles != nil {
					t.Errorf("disaggregated: %d nodes, policies %+v", got.Nodes, got.Policies)
				}
			}
			if cfg.Models > 1 && (len(got.Policies) != 2 || got.Policies[1].Name != NoDelegatePolicy || !got.Policies[1].NoDelegate || got.Policies[0].NoDelegate) {
				t.Errorf("models: policies %+v, want kvmesh and %s", got.Policies, NoDelegatePolicy)
			}
			if got.Engines == "" || got.LinkGBps != 25 || got.Nodes <= 0 || got.TimeScale <= 0 || len(got.Loads) == 0 || len(got.Policies) == 0 ||
				got.Duration <= 0 || got.KVBlocks <= 0 || got.ProbeDuration <= 0 || got.ProbeRate <= 0 || got.ProbeAttainment <= 0 || got.ProbeSteps <= 0 {
				t.Errorf("defaults not filled: %+v", got)
			}
		})
	}
}

func TestDefaultPolicies(t *testing.T) {
	ps := DefaultPolicies()
	want := map[string][2]string{
		"round-robin":      {"round-robin", node.AdmissionNone},
		"least-load":       {"least-load", node.AdmissionNone},
		"cache-aware":      {"cache-aware", node.AdmissionNone},
		"cache-aware-qcap": {"cache-aware", node.AdmissionQueueCap},
		"kvmesh":           {"kvmesh", node.AdmissionKvmesh},
	}
	if len(ps) != len(want) {
		t.Fatalf("%d policies, want %d", len(ps), len(want))
	}
	for _, p := range ps {
		w, ok := want[p.Name]
		if !ok || p.Route != w[0] || p.Admission != w[1] {
			t.Errorf("policy %+v, want route/admission %v", p, w)
		}
		if got, ok := PolicyByName(p.Name); !ok || !reflect.DeepEqual(got, p) {
			t.Errorf("PolicyByName(%q) = %+v, %v", p.Name, got, ok)
		}
	}
	if _, ok := PolicyByName("nope"); ok {
		t.Error("PolicyByName found an unknown policy")
	}
	if p, _ := PolicyByName("cache-aware-qcap"); p.QueueCap <= 0 {
		t.Error("the queue-cap policy has no cap")
	}
}

func TestRatios(t *testing.T) {
	rows := []Row{
		{Policy: "round-robin", Load: 0.5, GoodputRPS: 4},
		{Policy: "cache-aware", Load: 0.5, GoodputRPS: 5},
		{Policy: "kvmesh", Load: 0.5, GoodputRPS: 5},
		{Policy: "round-robin", Load: 1.5, GoodputRPS: 0},
		{Policy: "cache-aware", Load: 1.5, GoodputRPS: 2},
		{Policy: "kvmesh", Load: 1.5, GoodputRPS: 7},
		{Policy: "round-robin", Load: 2, GoodputRPS: 0},
		{Policy: "kvmesh", Load: 2, GoodputRPS: 3},
		{Policy: "round-robin", Load: 3, GoodputRPS: 1}, // no kvmesh row: left out
	}
	got := Ratios(rows)
	want := []Ratio{
		{Load: 0.5, KvmeshGoodput: 5, Best: "cache-aware", BestGoodput: 5, Ratio: 1},
		{Load: 1.5, KvmeshGoodput: 7, Best: "cache-aware", BestGoodput: 2, Ratio: 3.5},
		{Load: 2, KvmeshGoodput: 3, Best: "round-robin", BestGoodput: 0, Ratio: 0},
	}
	if len(got) != len(want) {
		t.Fatalf("Ratios = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("ratio %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestNewRowScalesToSimulatedTime(t *testing.T) {
	rep := &loadgen.Report{
		Sent: 10, Completed: 7, Refused: 2, Failed: 1, Good: 5, OfferedRate: 20, Goodput: 10,
		Attainment: 0.5, CachedRatio: 0.25, TTFT: loadgen.Percentiles{P99: 0.2},
		Classes: map[string]*loadgen.ClassReport{
			"interactive": {Name: "interactive", GroupReport: loadgen.GroupReport{Sent: 6, Attainment: 0.75}},
		},
	}
	r := newRow("kvmesh", 1.5, rep, nil, 10, "interactive")
	if r.OfferedRPS != 2 || r.GoodputRPS != 1 || math.Abs(r.P99TTFT-2) > 1e-9 {
		t.Errorf("rates and latency not in simulated time: %+v", r)
	}
	if r.RefusalRate != 0.2 || r.HighSent != 6 || r.HighAttainment != 0.75 || r.CacheHitRatio != 0.25 {
		t.Errorf("row %+v", r)
	}
	if r.Sent != r.Completed+r.Refused+r.Failed {
		t.Errorf("counts not copied: %+v", r)
	}
}

func TestSearchKnee(t *testing.T) {
	tests := []struct {
		name        string
		start, knee float64
		steps       int
		want        float64 // the last rate met
		tried       []float64
	}{
		{"doubles up to the knee, then bisects", 10, 50, 2, 40 * math.Pow(2, 0.25), []float64{10, 20, 40, 80, 40 * math.Sqrt2, 40 * math.Pow(2, 0.25)}},
		{"halves down from an overloaded start", 10, 3, 0, 2.5, []float64{10, 5, 2.5}},
		{"knee exactly on a tried rate counts as met", 10, 20, 0, 20, []float64{10, 20, 40}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tried []float64
			got, err := searchKnee(tt.start, tt.steps, func(rate float64) (bool, error) {
				tried = append(tried, rate)
				return rate <= tt.knee, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(got-tt.want) > 1e-9 || len(tried) != len(tt.tried) {
				t.Fatalf("searchKnee = %g after %v, want %g after %v", got, tried, tt.want, tt.tried)
			}
			for i := range tried {
				if math.Abs(tried[i]-tt.tried[i]) > 1e-9 {
					t.Errorf("step %d tried %g, want %g", i, tried[i], tt.tried[i])
				}
			}
		})
	}
	t.Run("never met nor missed", func(t *testing.T) {
		n := 0
		_, err := searchKnee(1, 3, func(float64) (bool, error) { n++; return true, nil })
		if !errors.Is(err, ErrProbe) || n != maxProbeDoublings {
			t.Errorf("err %v after %d steps, want ErrProbe after %d", err, n, maxProbeDoublings)
		}
	})
	t.Run("a step's error stops the search", func(t *testing.T) {
		boom := errors.New("boom")
		if _, err := searchKnee(1, 3, func(float64) (bool, error) { return false, boom }); !errors.Is(err, boom) {
			t.Errorf("err %v", err)
		}
	})
}

// TestRunShort runs the whole benchmark in miniature: a probe and two policies on two-node
// testnets, one load, about a second per run.
func TestRunShort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three testnets")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	rr, _ := PolicyByName("round-robin")
	km, _ := PolicyByName("kvmesh")
	cfg := Config{
		Nodes: 2, TimeScale: 20, Workload: "chat", Loads: []float64{1}, Policies: []Policy{rr, km}, ProbeAttainment: 0.5,
		Duration: 1500 * time.Millisecond, ProbeDuration: time.Second, ProbeSteps: 1, Seed: 3, Warmup: 300 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	}
	var progress, records bytes.Buffer
	cfg.Progress, cfg.Requests = &progress, &records
	res, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("Run: %v\nprogress:\n%s", err, progress.String())
	}
	if res.Capacity <= 0 || res.Probe == nil || len(res.Probe.Steps) < 3 || res.Capacity != maxMet(res.Probe) {
		t.Fatalf("no capacity measured: %+v", res.Probe)
	}
	if len(res.Rows) != 2 {
		t.Fatalf("%d rows, want one per policy", len(res.Rows))
	}
	for i, row := range res.Rows {
		if row.Policy != cfg.Policies[i].Name || row.Load != 1 || row.Report == nil {
			t.Errorf("row %d: %s at %g, report %v", i, row.Policy, row.Load, row.Report != nil)
			continue
		}
		if row.Sent == 0 || row.Sent != row.Completed+row.Refused+row.Failed {
			t.Errorf("%s: sent %d != completed %d + refused %d + failed %d", row.Policy, row.Sent, row.Completed, row.Refused, row.Failed)
		}
		if row.Completed == 0 || row.Good > row.Completed || row.HighSent == 0 || row.HighSent > row.Sent {
			t.Errorf("%s: completed %d good %d high sent %d", row.Policy, row.Completed, row.Good, row.HighSent)
		}
		if row.Report.Sent != row.Sent || row.P99TTFT <= 0 || row.OfferedRPS <= 0 {
			t.Errorf("%s: row %+v does not summarise its report", row.Policy, row)
		}
		if len(row.Bounds) != 2 || row.Bounds[0].Class != "interactive" || row.OracleHitRatio == nil {
			t.Errorf("%s: bounds %+v, oracle %v", row.Policy, row.Bounds, row.OracleHitRatio)
		}
		if len(row.Classes) != 2 || row.Classes[0].Class != "interactive" || row.Classes[0].TTFT.Count == 0 || row.Classes[0].TTFTSLO <= 0 {
			t.Errorf("%s: classes %+v", row.Policy, row.Classes)
		}
	}
	if n := strings.Count(progress.String(), "warm-up at 1×"); n != 2 {
		t.Errorf("%d warm-ups in the progress, want one per policy:\n%s", n, progress.String())
	}
	if len(res.Ratios) != 1 || res.Ratios[0].Best != "round-robin" || res.Ratios[0].KvmeshGoodput != res.Rows[1].GoodputRPS {
		t.Errorf("ratios %+v", res.Ratios)
	}
	// One request record per request of each measured run, none of the probe's.
	runs := map[string]int{}
	for dec := json.NewDecoder(&records); dec.More(); {
		var r loadgen.RequestRecord
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("request record: %v", err)
		}
		runs[r.Run]++
	}
	if want := map[string]int{"round-robin@1": res.Rows[0].Sent, "kvmesh@1": res.Rows[1].Sent}; fmt.Sprint(runs) != fmt.Sprint(want) {
		t.Errorf("request records by run %v, want %v", runs, want)
	}

	var table bytes.Buffer
	if err := res.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"capacity", "round-robin", "kvmesh", "best other", "engine scheduling (baseline priority): priority for round-robin, kvmesh",
		"oracle hit", "its bound", "attainment/bound", "after a 0.3s warm-up"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}

	var js bytes.Buffer
	if err := res.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("JSON: %v", err)
	}
	for _, k := range []string{"nodes", "time_scale", "capacity_rps", "probe", "rows", "ratios", "baseline_scheduling", "warmup_s"} {
		if _, ok := back[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
	var typed Result
	if err := json.Unmarshal(js.Bytes(), &typed); err != nil || len(typed.Rows) != 2 || typed.Rows[0].Sent != res.Rows[0].Sent {
		t.Errorf("JSON does not round-trip: %v", err)
	}

	var svg bytes.Buffer
	if err := res.WriteSVG(&svg); err != nil {
		t.Fatal(err)
	}
	checkXML(t, svg.Bytes())
	for _, p := range cfg.Policies {
		if !strings.Contains(svg.String(), ">"+p.Name+"<") {
			t.Errorf("SVG has no series %q", p.Name)
		}
	}
	var page bytes.Buffer
	if err := res.WriteHTML(&page); err != nil {
		t.Fatal(err)
	}
	if text := xmlText(t, page.Bytes()); !strings.Contains(text, "p99 TTFT of interactive (s)") || !strings.Contains(text, "round-robin") {
		t.Errorf("the page lacks the per-class TTFT plot or a policy")
	}
}

// TestEngineScheduling pins which engines schedule how: with BaselineScheduling fcfs every
// policy but kvmesh, and the capacity probe, runs its engines first come first served, and
// kvmesh's engines schedule by priority; the default keeps priority everywhere; a policy that
// names its own keeps it. It starts each policy's testnet (two nodes) and reads what every
// node's engine was configured with and what it reports in its gossiped state.
func TestEngineScheduling(t *testing.T) {
	explicit := Policy{Name: "rr-priority", Route: "round-robin", Admission: node.AdmissionNone, EngineScheduling: sim.SchedulingPriority}
	all := append(DefaultPolicies(), explicit)
	resolved := func(baseline string) map[string]string {
		t.Helper()
		cfg, err := Config{BaselineScheduling: baseline, Policies: all}.validate()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, p := range cfg.Policies {
			got[p.Name] = p.EngineScheduling
		}
		got[ProbePolicy.Name] = (&bencher{cfg: cfg}).probePolicy().EngineScheduling
		return got
	}
	for _, baseline := range []string{"", sim.SchedulingPriority, sim.SchedulingFCFS} {
		got := resolved(baseline)
		for name, s := range got {
			want := baseline
			switch {
			case want == "", name == KvmeshPolicy, name == explicit.Name:
				want = sim.SchedulingPriority
			}
			if s != want {
				t.Errorf("baseline %q: policy %s's engines schedule %q, want %q", baseline, name, s, want)
			}
		}
	}
	if all[0].EngineScheduling != "" {
		t.Errorf("validate wrote the caller's policies: %+v", all[0])
	}

	if testing.Short() {
		t.Skip("starts testnets")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	var configured []string // node i's engine scheduling, as the bench configured it
	cfg, err := Config{
		Nodes: 2, TimeScale: 20, BaselineScheduling: sim.SchedulingFCFS, Logger: slog.New(slog.DiscardHandler),
		Configure: func(i int, nc *node.Config) { configured = append(configured, nc.Sim.SchedulingPolicy) },
	}.validate()
	if err != nil {
		t.Fatal(err)
	}
	b := &bencher{cfg: cfg}
	rr, _ := PolicyByName("round-robin")
	km, _ := PolicyByName(KvmeshPolicy)
	for _, tt := range []struct {
		policy Policy
		want   string
	}{{b.probePolicy(), sim.SchedulingFCFS}, {rr, sim.SchedulingFCFS}, {km, sim.SchedulingPriority}} {
		p := tt.policy
		if i := slices.IndexFunc(cfg.Policies, func(q Policy) bool { return q.Name == p.Name }); i >= 0 {
			p = cfg.Policies[i] // as validate resolved it
		}
		configured = nil
		tn, err := b.start(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if len(configured) != cfg.Nodes || slices.ContainsFunc(configured, func(s string) bool { return s != tt.want }) {
			t.Errorf("%s: nodes' engines configured %v, want %s", p.Name, configured, tt.want)
		}
		for _, n := range tn.Nodes {
			for _, m := range n.Members() {
				if m.State.PriorityScheduling != (tt.want == sim.SchedulingPriority) {
					t.Errorf("%s: %s sees %s's engine report priority scheduling %v, want %s", p.Name, n.Name(), m.Name, m.State.PriorityScheduling, tt.want)
				}
			}
		}
		if err := tn.Close(); err != nil {
			t.Error(err)
		}
	}
}

// maxMet is the highest rate of p's steps that met its attainment.
func maxMet(p *Probe) float64 {
	best := 0.0
	for _, st := range p.Steps {
		if st.Sent > 0 && st.Attainment >= p.Attainment {
			best = max(best, st.OfferedRPS)
		}
	}
	return best
}

// checkXML fails unless b is well-formed XML with an svg root.
func checkXML(t *testing.T, b []byte) {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(b))
	root := ""
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && root == "" {
			root = se.Name.Local
		}
	}
	if root != "svg" {
		t.Fatalf("SVG root %q", root)
	}
}
