package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/kvmesh/kvmesh/testnet/loadgen"
)

// Probe is the capacity measurement. Rates are simulated (see the package doc).
type Probe struct {
	// Capacity is the highest offered rate, in requests per simulated second, at which Policy
	// (routing, no admission) met Attainment of SLOs.
	Capacity float64 `json:"capacity_rps"`
	Policy   string  `json:"policy"`
	// EngineScheduling is the probe's engines' scheduling policy (Config.BaselineScheduling).
	EngineScheduling string  `json:"engine_scheduling"`
	Attainment       float64 `json:"attainment"`
	// Steps are the rates tried, in order.
	Steps []ProbeStep `json:"steps"`
}

// ProbeStep is one rate the probe offered and how the baseline did.
type ProbeStep struct {
	OfferedRPS float64 `json:"offered_rps"`
	Sent       int     `json:"sent"`
	Good       int     `json:"good"`
	Attainment float64 `json:"slo_attainment"`
}

// Row is one policy at one load. Rates and latencies are in simulated time.
type Row struct {
	Policy string `json:"policy"`
	// Load is the offered load as a multiple of capacity; OfferedRPS what was actually offered.
	Load       float64 `json:"load"`
	OfferedRPS float64 `json:"offered_rps"`
	// Sent = Completed + Refused + Failed.
	Sent      int `json:"sent"`
	Completed int `json:"completed"`
	Refused   int `json:"refused"`
	Failed    int `json:"failed"`
	Good      int `json:"good"`
	// GoodputRPS is requests that met both SLOs per second; Attainment is Good/Sent, and
	// HighAttainment the same for the interactive (high-priority) class alone, of HighSent.
	GoodputRPS     float64 `json:"goodput_rps"`
	Attainment     float64 `json:"slo_attainment"`
	HighSent       int     `json:"high_sent"`
	HighAttainment float64 `json:"high_slo_attainment"`
	// P50TTFT and P99TTFT are over completed requests, P99TPOT over those of two tokens or
	// more and HighP99TPOT over the interactive class's, in seconds.
	P50TTFT     float64 `json:"p50_ttft_s"`
	P99TTFT     float64 `json:"p99_ttft_s"`
	P99TPOT     float64 `json:"p99_tpot_s"`
	HighP99TPOT float64 `json:"high_p99_tpot_s"`
	// RefusalRate is Refused/Sent; CacheHitRatio cached over prompt tokens of completed requests.
	RefusalRate   float64 `json:"refusal_rate"`
	CacheHitRatio float64 `json:"cache_hit_ratio"`
	// OracleHitRatio is the pooled-LRU oracle's hit ratio on the same requests (see the package
	// doc), the same for every policy at a load; absent for the agents workload.
	OracleHitRatio *float64 `json:"oracle_cache_hit_ratio,omitempty"`
	// Bounds holds each class's attainment against the bound (see ClassBound), classes in
	// priority order; HighBound and HighBoundRatio are the interactive class's Bound and Ratio.
	Bounds         []ClassBound `json:"bounds"`
	HighBound      float64      `json:"high_bound"`
	HighBoundRatio float64      `json:"high_bound_ratio"`
	// Classes holds each class's counts and latencies, in simulated time, in Bounds' order.
	Classes []ClassRow `json:"classes"`
	// RefusalsByReason and Failures are copied from the report, for the table.
	RefusalsByReason map[string]int `json:"refusals_by_reason"`
	Failures         map[string]int `json:"failures"`
	// Residency is the residency model's error over the run, for external engines.
	Residency *ResidencyError `json:"residency_error,omitempty"`
	// AdapterLoadsPer1k is the adapters workload's adapter loads into GPU slots, over every
	// engine, per 1,000 requests sent.
	AdapterLoadsPer1k *float64 `json:"adapter_loads_per_1k,omitempty"`
	// With Config.Disaggregated: Disaggregated counts the run's dispatches by
	// kvmesh_route_disaggregated_total's outcome (none on mixed nodes), Split and Whole sum
	// its split and whole_* ones; Pools is the per-pool timeline, and PoolCorrelation the
	// correlation of the prefill and decode pools' accepted requests per second over the
	// arrival window (absent without both pools).
	Disaggregated   map[string]int           `json:"disaggregated,omitempty"`
	Split           int                      `json:"split"`
	Whole           int                      `json:"whole"`
	Pools           map[string]*PoolTimeline `json:"pools,omitempty"`
	PoolCorrelation *float64                 `json:"pool_correlation,omitempty"`
	// Paths, with Config.Disaggregated on every policy's rows, is each class's latency by the
	// path its completed requests took (PathLatency).
	Paths []PathLatency `json:"paths,omitempty"`
	// With Config.Models: Entries holds the requests that entered through a node of their
	// own model (loadgen.EntryOwn) and through another model's (loadgen.EntryOther), and
	// OtherOverOwn compares them; Delegated counts the run's kvmesh_route_delegated_total by
	// outcome (delegated, fallback and no_delegate at the ingress, served at the delegate).
	Entries      map[string]*EntryRow `json:"entries,omitempty"`
	OtherOverOwn *EntryComparison     `json:"other_over_own,omitempty"`
	Delegated    map[string]int       `json:"delegated,omitempty"`
	// Report is loadgen's report of the run, in wall time.
	Report *loadgen.Report `json:"report"`
}

func frac(a, b int) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// newRow summarises rep, a run at wall rates, in simulated time; recs are its request records
// (see Bounds).
func newRow(policy string, load float64, rep *loadgen.Report, recs []loadgen.RequestRecord, timeScale float64, interactive string) Row {
	r := Row{
		Policy: policy, Load: load, OfferedRPS: rep.OfferedRate / timeScale,
		Sent: rep.Sent, Completed: rep.Completed, Refused: rep.Refused, Failed: rep.Failed, Good: rep.Good,
		GoodputRPS: rep.Goodput / timeScale, Attainment: rep.Attainment,
		P50TTFT: rep.TTFT.P50 * timeScale, P99TTFT: rep.TTFT.P99 * timeScale, P99TPOT: rep.TPOT.P99 * timeScale,
		RefusalRate: frac(rep.Refused, rep.Sent), CacheHitRatio: rep.CachedRatio,
		RefusalsByReason: rep.RefusalsByReason, Failures: rep.Failures,
		Report: rep,
	}
	if c := rep.Classes[interactive]; c != nil {
		r.HighSent, r.HighAttainment, r.HighP99TPOT = c.Sent, c.Attainment, c.TPOT.P99*timeScale
	}
	r.Bounds = Bounds(rep, recs)
	r.Classes = classRows(rep, timeScale)
	r.Entries, r.OtherOverOwn = entryRows(rep, timeScale)
	for _, b := range r.Bounds {
		if b.Class == interactive {
			r.HighBound, r.HighBoundRatio = b.Bound, b.Ratio
		}
	}
	return r
}

// byPriority returns rep's classes in priority order, highest first (ties by name).
func byPriority(rep *loadgen.Report) []*loadgen.ClassReport {
	classes := slices.Collect(maps.Values(rep.Classes))
	slices.SortFunc(classes, func(a, b *loadgen.ClassReport) int {
		if a.Priority != b.Priority {
			return b.Priority - a.Priority
		}
		return strings.Compare(a.Name, b.Name)
	})
	return classes
}

// ClassRow is one priority class's part of a Row; its SLOs and latencies are in simulated
// seconds. A zero SLO is one the workload did not set (the mesh fitted it).
type ClassRow struct {
	Class      string              `json:"class"`
	Priority   int                 `json:"priority"`
	TTFTSLO    float64             `json:"ttft_slo_s"`
	TPOTSLO    float64             `json:"tpot_slo_s"`
	Sent       int                 `json:"sent"`
	Completed  int                 `json:"completed"`
	Refused    int                 `json:"refused"`
	Failed     int                 `json:"failed"`
	Good       int                 `json:"good"`
	Attainment float64             `json:"slo_attainment"`
	TTFT       loadgen.Percentiles `json:"ttft"`
	TPOT       loadgen.Percentiles `json:"tpot"`
}

// classRows returns rep's classes in priority order, its wall-time figures scaled by timeScale.
func classRows(rep *loadgen.Report, timeScale float64) []ClassRow {
	classes := byPriority(rep)
	out := make([]ClassRow, len(classes))
	for i, c := range classes {
		out[i] = ClassRow{
			Class: c.Name, Priority: c.Priority, TTFTSLO: c.TTFTSLO * timeScale, TPOTSLO: c.TPOTSLO * timeScale,
			Sent: c.Sent, Completed: c.Completed, Refused: c.Refused, Failed: c.Failed, Good: c.Good,
			Attainment: c.Attainment, TTFT: scaled(c.TTFT, timeScale), TPOT: scaled(c.TPOT, timeScale),
		}
	}
	return out
}

func scaled(p loadgen.Percentiles, k float64) loadgen.Percentiles {
	p.Mean, p.P50, p.P90, p.P99, p.Max = p.Mean*k, p.P50*k, p.P90*k, p.P99*k, p.Max*k
	return p
}

// Ratio compares kvmesh's goodput with the best other policy's at one load.
type Ratio struct {
	Load          float64 `json:"load"`
	KvmeshGoodput float64 `json:"kvmesh_goodput_rps"`
	Best          string  `json:"best_other"`
	BestGoodput   float64 `json:"best_other_goodput_rps"`
	// Ratio is KvmeshGoodput/BestGoodput; 0 when the best other policy's goodput is 0.
	Ratio float64 `json:"ratio"`
}

// Ratios compares the KvmeshPolicy row of each load with the best other row at that load,
// in the order loads first appear. Loads without a kvmesh row or without another row are left
// out.
func Ratios(rows []Row) []Ratio {
	var loads []float64
	for _, r := range rows {
		if !slices.Contains(loads, r.Load) {
			loads = append(loads, r.Load)
		}
	}
	var out []Ratio
	for _, l := range loads {
		var km *Row
		best := Ratio{Load: l, BestGoodput: -1}
		for i := range rows {
			r := &rows[i]
			switch {
			case r.Load != l:
			case r.Policy == KvmeshPolicy:
				km = r
			case r.GoodputRPS > best.BestGoodput:
				best.Best, best.BestGoodput = r.Policy, r.GoodputRPS
			}
		}
		if km == nil || best.Best == "" {
			continue
		}
		best.KvmeshGoodput = km.GoodputRPS
		if best.BestGoodput > 0 {
			best.Ratio = km.GoodputRPS / best.BestGoodput
		}
		out = append(out, best)
	}
	return out
}

// Result is a benchmark's outcome. Its JSON field names are stable.
type Result struct {
	Nodes int `json:"nodes"`
	// Models is Config.Models (0: one model).
	Models int `json:"models,omitempty"`
	// Engines is where the simulated engines ran: embedded in the nodes or external.
	Engines   string  `json:"engines"`
	TimeScale float64 `json:"time_scale"`
	// Workload is the synthetic workload's name, or "trace" with Trace the file.
	Workload string  `json:"workload"`
	Trace    string  `json:"trace,omitempty"`
	Speedup  float64 `json:"speedup"`
	Scale    float64 `json:"scale"`
	Seed     int64   `json:"seed"`
	// Duration is each run's arrival window in wall seconds, Warmup the warm-up's before it
	// (Config.Warmup; 0: none).
	Duration float64 `json:"duration_s"`
	Warmup   float64 `json:"warmup_s"`
	// SharedPrefix is the shared-prefix workload's shape, for that workload.
	SharedPrefix *loadgen.SharedPrefix `json:"shared_prefix,omitempty"`
	KVBlocks     int                   `json:"kv_blocks"`
	Loads        []float64             `json:"loads"`
	Policies     []Policy              `json:"policies"`
	Interactive  string                `json:"interactive_class"`
	// Disaggregated is Config.Disaggregated, the roles of DisaggPolicy's nodes; LinkGBps the
	// KV link's bandwidth in GB/s; DecodeBatchedTokens the decode nodes' step budget (0: the
	// engine's).
	Disaggregated       []string `json:"disaggregated,omitempty"`
	LinkGBps            float64  `json:"link_gbps"`
	DecodeBatchedTokens int      `json:"decode_batched_tokens,omitempty"`
	// BatchedTokens is Config.BatchedTokens, every engine's step budget (0: the engine's).
	BatchedTokens int `json:"batched_tokens,omitempty"`
	// BaselineScheduling is Config.BaselineScheduling; each policy's engines' scheduling is
	// its Policies entry's EngineScheduling.
	BaselineScheduling string `json:"baseline_scheduling"`
	// Capacity is Probe.Capacity, or Config.Capacity when it was given (Probe is then nil),
	// in requests per simulated second.
	Capacity float64 `json:"capacity_rps"`
	Probe    *Probe  `json:"probe"`
	// Rows holds one row per policy and load, policies in order, loads in order within each.
	Rows   []Row   `json:"rows"`
	Ratios []Ratio `json:"ratios"`
}

// WriteJSON writes r as indented JSON.
func (r *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func pct(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) }

func counts(m map[string]int) string {
	if len(m) == 0 {
		return "-"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s:%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

// WriteTable writes the per-policy, per-load table and kvmesh's goodput ratios.
func (r *Result) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	p := func(format string, a ...any) { fmt.Fprintf(tw, format, a...) }
	src := r.Workload
	if r.Trace != "" {
		src = fmt.Sprintf("trace %s (speedup %g, scale %g)", r.Trace, r.Speedup, r.Scale)
	}
	engines := r.Engines
	if engines == "" {
		engines = "embedded"
	}
	if sp := r.SharedPrefix; sp != nil {
		src += fmt.Sprintf(" (%d tenants or adapters, ~%d-token system prompts, ~%d-token questions, ~%d-token replies, tenant zipf %g, %s follow-ups)",
			sp.Tenants, sp.SystemTokens, sp.QuestionTokens, sp.ReplyTokens, sp.TenantZipf, pct(sp.FollowUps))
	}
	warm := ""
	if r.Warmup > 0 {
		warm = fmt.Sprintf(" after a %gs warm-up", r.Warmup)
	}
	p("kvmesh bench: %d nodes, %s engines, %s, seed %d, time scale %g, %gs per run%s, %d KV blocks per engine\n",
		r.Nodes, engines, src, r.Seed, r.TimeScale, r.Duration, warm, r.KVBlocks)
	p("engine scheduling (baseline %s): %s\n", r.BaselineScheduling, schedulingByPolicy(r.Policies))
	modelsLine(r.Models, r.Nodes, p)
	if r.BatchedTokens > 0 {
		p("engines' step budget %d tokens\n", r.BatchedTokens)
	}
	if len(r.Disaggregated) > 0 {
		budget := ""
		if r.DecodeBatchedTokens > 0 {
			budget = fmt.Sprintf(", decode nodes' step budget %d tokens", r.DecodeBatchedTokens)
		}
		p("%s: nodes %s, KV link %g GB/s%s; kvmesh on as many mixed nodes\n", DisaggPolicy, strings.Join(r.Disaggregated, ","), r.LinkGBps, budget)
	}
	p("rates, latencies in simulated time (wall × time scale)\n")
	if r.Probe == nil {
		p("capacity %.2f req/s: given\n", r.Capacity)
	} else {
		var steps []string
		for _, st := range r.Probe.Steps {
			steps = append(steps, fmt.Sprintf("%.2f:%s", st.OfferedRPS, pct(st.Attainment)))
		}
		p("capacity %.2f req/s: the highest rate at which %s routing without admission, on %s engines, met %s of SLOs (probed %s)\n",
			r.Capacity, r.Probe.Policy, r.Probe.EngineScheduling, pct(r.Probe.Attainment), strings.Join(steps, " "))
	}
	p("\npolicy\tload\toffered\tsent\tcompleted\trefused\tfailed\tgoodput\tSLO att.\t%s att.\tits bound\tatt./bound\tp50 TTFT\tp99 TTFT\t%s p99 TPOT\trefusals\tcache hit\toracle hit\trefusal reasons\tfailures\n", r.Interactive, r.Interactive)
	p("\t×cap\treq/s\t\t\t\t\treq/s\t\t\t\t\ts\ts\tms\t\t\t\t\t\n")
	for _, row := range r.Rows {
		oracle := "-"
		if row.OracleHitRatio != nil {
			oracle = pct(*row.OracleHitRatio)
		}
		p("%s\t%.2g\t%.2f\t%d\t%d\t%d\t%d\t%.2f\t%s\t%s\t%s\t%s\t%.2f\t%.2f\t%.1f\t%s\t%s\t%s\t%s\t%s\n",
			row.Policy, row.Load, row.OfferedRPS, row.Sent, row.Completed, row.Refused, row.Failed,
			row.GoodputRPS, pct(row.Attainment), pct(row.HighAttainment), pct(row.HighBound), boundRatio(row.HighBound, row.HighBoundRatio),
			row.P50TTFT, row.P99TTFT, 1000*row.HighP99TPOT,
			pct(row.RefusalRate), pct(row.CacheHitRatio), oracle, counts(row.RefusalsByReason), counts(row.Failures))
	}
	if boundRows(r.Rows) {
		p("\npolicy\tload\tclass\tsent\tgood\tattainment\tbound\tattainment/bound\n")
		for _, row := range r.Rows {
			for _, b := range row.Bounds {
				p("%s\t%.2g\t%s\t%d\t%d\t%s\t%s\t%s\n", row.Policy, row.Load, b.Class, b.Sent, b.Good, pct(b.Attainment), pct(b.Bound), boundRatio(b.Bound, b.Ratio))
			}
		}
	}
	if slices.ContainsFunc(r.Rows, func(row Row) bool { return len(row.Entries) > 0 }) {
		writeEntries(r.Rows, p)
	}
	if len(r.Disaggregated) > 0 {
		p("\npolicy\tload\tsplit\twhole\taccepted/refused by pool\taccepted/s CV by pool\tcorr(prefill, decode)\n")
		for _, row := range r.Rows {
			var ar, cvs []string
			for _, name := range poolOrder {
				if t := row.Pools[name]; t != nil {
					ar = append(ar, fmt.Sprintf("%s %d/%d", name, t.Accepted, t.Refused))
					cvs = append(cvs, fmt.Sprintf("%s %.2f", name, t.AcceptedCV))
				}
			}
			corr := "n/a"
			if row.PoolCorrelation != nil {
				corr = fmt.Sprintf("%.2f", *row.PoolCorrelation)
			}
			p("%s\t%.2g\t%d\t%d\t%s\t%s\t%s\n", row.Policy, row.Load, row.Split, row.Whole, strings.Join(ar, " "), strings.Join(cvs, " "), corr)
		}
	}
	writePaths(r.Rows, p)
	if res := residencyRows(r.Rows); len(res) > 0 {
		p("\npolicy\tload\tresidency error median\tp90\tjudged requests\tcached tokens predicted\treported\n")
		for _, row := range res {
			r := row.Residency
			p("%s\t%.2g\t%s\t%s\t%d\t%.0f\t%.0f\n", row.Policy, row.Load, pct(r.P50), pct(r.P90), r.Judged, r.Predicted, r.Reported)
		}
	}
	writeAdapterLoads(r.Rows, p)
	if len(r.Ratios) > 0 {
		p("\nload\tkvmesh goodput\tbest other\tits goodput\tkvmesh / best other\n")
		for _, q := range r.Ratios {
			ratio := "n/a"
			if q.BestGoodput > 0 {
				ratio = fmt.Sprintf("%.2f×", q.Ratio)
			}
			p("%.2g\t%.2f\t%s\t%.2f\t%s\n", q.Load, q.KvmeshGoodput, q.Best, q.BestGoodput, ratio)
		}
	}
	return tw.Flush()
}

// schedulingByPolicy says which policies' engines ran under which scheduling policy, e.g.
// "fcfs for round-robin, least-load; priority for kvmesh", settings in their first policy's order.
func schedulingByPolicy(ps []Policy) string {
	var order []string
	names := map[string][]string{}
	for _, p := range ps {
		if _, ok := names[p.EngineScheduling]; !ok {
			order = append(order, p.EngineScheduling)
		}
		names[p.EngineScheduling] = append(names[p.EngineScheduling], p.Name)
	}
	parts := make([]string, len(order))
	for i, s := range order {
		parts[i] = s + " for " + strings.Join(names[s], ", ")
	}
	return strings.Join(parts, "; ")
}

// boundRatio formats an attainment ÷ bound ratio: "-" where the bound is 0 and the ratio
// undefined.
func boundRatio(bound, ratio float64) string {
	if bound <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", ratio)
}

// boundRows reports whether any row has more than one class: a single class's bound is the
// main table's.
func boundRows(rows []Row) bool {
	return slices.ContainsFunc(rows, func(r Row) bool { return len(r.Bounds) > 1 })
}

// residencyRows are the rows that measured a residency model (external engines).
func residencyRows(rows []Row) []Row {
	var out []Row
	for _, row := range rows {
		if row.Residency != nil {
			out = append(out, row)
		}
	}
	return out
}
