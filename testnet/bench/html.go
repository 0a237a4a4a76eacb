package bench

import (
	"bytes"
	"fmt"
	"html/template"
	"io"
	"maps"
	"slices"
	"strconv"

	"github.com/kvmesh/kvmesh/testnet/loadgen"
)

// htmlCell is one cell of an htmlTable: a row header (the run it describes) or a value,
// Strong for the best of its column.
type htmlCell struct {
	Text   string
	Header bool
	Strong bool
}

type htmlTable struct {
	ID, Caption, Note string
	Head              []string
	Rows              [][]htmlCell
}

type htmlFigure struct {
	Caption string
	SVG     template.HTML
}

type htmlPage struct {
	Title   string
	Setup   [][2]string
	Figures []htmlFigure
	Tables  []htmlTable
	Text    string
}

// The page is well-formed XML as well as HTML (void elements closed, no named entities),
// so that it can be checked by an XML parser; its CSS has no '<' or '&'.
var pageTmpl = template.Must(template.New("page").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8"/>
<meta name="viewport" content="width=device-width, initial-scale=1"/>
<title>{{.Title}}</title>
<style>
body { font-family: system-ui, sans-serif; color: #111; background: #fff; margin: 1.5rem; line-height: 1.4; }
h1, h2 { font-weight: 600; }
dl { display: grid; grid-template-columns: max-content auto; gap: 0.2rem 1rem; }
dt { font-weight: 600; }
dd { margin: 0; }
figure { margin: 1rem 0; overflow-x: auto; }
figcaption, caption { font-weight: 600; text-align: left; padding: 0.3rem 0; }
table { border-collapse: collapse; margin: 0.5rem 0 1.5rem; }
th, td { border: 1px solid #999; padding: 0.2rem 0.5rem; text-align: right; }
thead th { background: #e8e8e8; }
tbody th { text-align: left; font-weight: normal; white-space: nowrap; }
td strong { color: #000; }
.note { color: #333; max-width: 60rem; }
pre { background: #f4f4f4; padding: 0.5rem; overflow-x: auto; }
.sr { position: absolute; width: 1px; height: 1px; overflow: hidden; clip-path: inset(50%); white-space: nowrap; }
</style>
</head>
<body>
<main>
<h1>{{.Title}}</h1>
<p class="note">Rates and latencies are in simulated time (wall time × time scale). Loads are multiples of the measured capacity.</p>
<dl>
{{- range .Setup}}
<dt>{{index . 0}}</dt><dd>{{index . 1}}</dd>
{{- end}}
</dl>
{{- range .Figures}}
<figure>
{{.SVG}}<figcaption>{{.Caption}}</figcaption>
</figure>
{{- end}}
{{- range .Tables}}
<section aria-labelledby="{{.ID}}">
<h2 id="{{.ID}}">{{.Caption}}</h2>
{{- if .Note}}
<p class="note">{{.Note}}</p>
{{- end}}
<table>
<caption class="sr">{{.Caption}}</caption>
<thead><tr>{{range .Head}}<th scope="col">{{.}}</th>{{end}}</tr></thead>
<tbody>
{{- range .Rows}}
<tr>{{range .}}{{if .Header}}<th scope="row">{{.Text}}</th>{{else if .Strong}}<td><strong>{{.Text}}</strong></td>{{else}}<td>{{.Text}}</td>{{end}}{{end}}</tr>
{{- end}}
</tbody>
</table>
</section>
{{- end}}
<details>
<summary>The terminal table</summary>
<pre>{{.Text}}</pre>
</details>
</main>
</body>
</html>
`))

// WriteHTML writes r as one self-contained HTML page: its setup, plots of goodput, each
// class's p99 TTFT and SLO attainment against load, tables of goodput per policy and load,
// each run's counts and cache hit ratio beside the oracle's, each class's attainment beside
// its bound and its TTFT and TPOT percentiles, refusals by reason, and WriteTable's text.
// Inline CSS and SVG only: no script, nothing fetched. Every string is escaped.
func (r *Result) WriteHTML(w io.Writer) error {
	page := htmlPage{Title: "kvmesh bench", Setup: r.setup()}
	var text bytes.Buffer
	if err := r.WriteTable(&text); err != nil {
		return err
	}
	page.Text = text.String()
	figs := []struct {
		caption, title string
		panels         []loadgen.LoadPanel
	}{
		{"Goodput, and each class's p99 TTFT (dashed: its SLO), against offered load; a line per policy.",
			"goodput and p99 TTFT per class against offered load", r.ttftPanels()},
		{"Each class's SLO attainment against offered load; a line per policy.",
			"SLO attainment per class against offered load",
			r.classPanels("SLO attainment of %s (%%)", func(c ClassRow) float64 { return 100 * c.Attainment }, nil)},
	}
	for _, f := range figs {
		var svg bytes.Buffer
		if err := loadgen.WriteLoadPanelsSVG(&svg, f.title, f.panels, 2); err != nil {
			return err
		}
		// The SVG is this package's own output, every string in it XML-escaped.
		page.Figures = append(page.Figures, htmlFigure{Caption: f.caption, SVG: template.HTML(svg.String())})
	}
	if slices.ContainsFunc(r.Rows, func(row Row) bool { return row.Pools != nil }) {
		var svg bytes.Buffer
		if err := r.WritePoolSVG(&svg); err != nil {
			return err
		}
		page.Figures = append(page.Figures, htmlFigure{Caption: "Requests each pool accepted (solid) and refused (dashed) per simulated second.", SVG: template.HTML(svg.String())})
	}
	page.Tables = []htmlTable{r.goodputTable(), r.runsTable(), r.attainmentTable(), r.latencyTable(), r.refusalsTable()}
	return pageTmpl.Execute(w, page)
}

func (r *Result) setup() [][2]string {
	engines := r.Engines
	if engines == "" {
		engines = "embedded"
	}
	workload := r.Workload
	if r.Trace != "" {
		workload = fmt.Sprintf("trace %s (speedup %g, scale %g)", r.Trace, r.Speedup, r.Scale)
	}
	capacity := fmt.Sprintf("%.2f req/s, given", r.Capacity)
	if r.Probe != nil {
		capacity = fmt.Sprintf("%.2f req/s: the highest rate at which %s routing without admission, on %s engines, met %s of SLOs",
			r.Capacity, r.Probe.Policy, r.Probe.EngineScheduling, pct(r.Probe.Attainment))
	}
	run := fmt.Sprintf("%gs of arrivals (wall)", r.Duration)
	if r.Warmup > 0 {
		run += fmt.Sprintf(" after a %gs warm-up", r.Warmup)
	}
	return [][2]string{
		{"nodes", strconv.Itoa(r.Nodes)}, {"engines", engines}, {"workload", workload},
		{"seed", strconv.FormatInt(r.Seed, 10)}, {"time scale", fmt.Sprintf("%g", r.TimeScale)},
		{"each run", run},
		{"KV blocks per engine", strconv.Itoa(r.KVBlocks)}, {"capacity", capacity},
		{"engine scheduling", fmt.Sprintf("baseline %s: %s", r.BaselineScheduling, schedulingByPolicy(r.Policies))},
	}
}

func runCells(row Row) []htmlCell {
	return []htmlCell{{Text: row.Policy, Header: true}, {Text: fmt.Sprintf("%g", row.Load)}}
}

func cells(texts ...string) []htmlCell {
	out := make([]htmlCell, len(texts))
	for i, t := range texts {
		out[i] = htmlCell{Text: t}
	}
	return out
}

// goodputTable is goodput per policy (rows) and load (columns), the best at each load strong,
// then kvmesh's ratio to the best other policy.
func (r *Result) goodputTable() htmlTable {
	t := htmlTable{ID: "goodput", Caption: "Goodput per policy and load (req/s; SLO attainment)", Head: []string{"policy"}}
	best := map[float64]float64{}
	for _, row := range r.Rows {
		best[row.Load] = max(best[row.Load], row.GoodputRPS)
	}
	for _, l := range r.Loads {
		t.Head = append(t.Head, fmt.Sprintf("%g× capacity", l))
	}
	for _, p := range r.policyOrder() {
		line := []htmlCell{{Text: p, Header: true}}
		for _, l := range r.Loads {
			c := htmlCell{Text: "-"}
			if i := slices.IndexFunc(r.Rows, func(row Row) bool { return row.Policy == p && row.Load == l }); i >= 0 {
				row := r.Rows[i]
				c = htmlCell{Text: fmt.Sprintf("%.2f (%s)", row.GoodputRPS, pct(row.Attainment)), Strong: row.GoodputRPS > 0 && row.GoodputRPS == best[l]}
			}
			line = append(line, c)
		}
		t.Rows = append(t.Rows, line)
	}
	for _, q := range r.Ratios {
		ratio := "n/a"
		if q.BestGoodput > 0 {
			ratio = fmt.Sprintf("%.2f×", q.Ratio)
		}
		t.Note += fmt.Sprintf("At %g× capacity kvmesh's goodput is %s that of the best other policy, %s. ", q.Load, ratio, q.Best)
	}
	return t
}

// policyOrder returns the rows' policies, each once, in row order.
func (r *Result) policyOrder() []string {
	var out []string
	for _, row := range r.Rows {
		if !slices.Contains(out, row.Policy) {
			out = append(out, row.Policy)
		}
	}
	return out
}

func (r *Result) runsTable() htmlTable {
	t := htmlTable{ID: "runs", Caption: "Runs",
		Note: "The oracle is one pooled LRU cache of every node's blocks fed every planned prompt in arrival order: no node boundaries, not an optimal bound.",
		Head: []string{"policy", "load", "offered (req/s)", "sent", "completed", "refused", "failed", "goodput (req/s)", "SLO attainment",
			"p50 TTFT (s)", "p99 TTFT (s)", "p99 TPOT (ms)", "cache hit", "oracle hit"}}
	for _, row := range r.Rows {
		oracle := "-"
		if row.OracleHitRatio != nil {
			oracle = pct(*row.OracleHitRatio)
		}
		t.Rows = append(t.Rows, append(runCells(row), cells(
			fmt.Sprintf("%.2f", row.OfferedRPS), strconv.Itoa(row.Sent), strconv.Itoa(row.Completed), strconv.Itoa(row.Refused),
			strconv.Itoa(row.Failed), fmt.Sprintf("%.2f", row.GoodputRPS), pct(row.Attainment),
			fmt.Sprintf("%.2f", row.P50TTFT), fmt.Sprintf("%.2f", row.P99TTFT), fmt.Sprintf("%.1f", 1000*row.P99TPOT),
			pct(row.CacheHitRatio), oracle)...))
	}
	return t
}

func (r *Result) attainmentTable() htmlTable {
	t := htmlTable{ID: "attainment", Caption: "SLO attainment per priority class",
		Note: "The bound is what an ideal admission could have given the class with the good first tokens the mesh served while the class's requests could still meet their TTFT target, spent on the classes in priority order.",
		Head: []string{"policy", "load", "class", "sent", "good", "SLO attainment", "bound", "attainment ÷ bound"}}
	for _, row := range r.Rows {
		for _, b := range row.Bounds {
			t.Rows = append(t.Rows, append(runCells(row), cells(b.Class, strconv.Itoa(b.Sent), strconv.Itoa(b.Good),
				pct(b.Attainment), pct(b.Bound), boundRatio(b.Bound, b.Ratio))...))
		}
	}
	return t
}

func (r *Result) latencyTable() htmlTable {
	t := htmlTable{ID: "latency", Caption: "TTFT and TPOT per priority class",
		Head: []string{"policy", "load", "class", "completed", "TTFT SLO (s)", "p50 TTFT (s)", "p90 TTFT (s)", "p99 TTFT (s)",
			"TPOT SLO (ms)", "p50 TPOT (ms)", "p90 TPOT (ms)", "p99 TPOT (ms)"}}
	s := func(v float64) string { return fmt.Sprintf("%.2f", v) }
	ms := func(v float64) string { return fmt.Sprintf("%.1f", 1000*v) }
	slo := func(v float64, f func(float64) string) string {
		if v <= 0 {
			return "fitted"
		}
		return f(v)
	}
	for _, row := range r.Rows {
		for _, c := range row.Classes {
			t.Rows = append(t.Rows, append(runCells(row), cells(c.Class, strconv.Itoa(c.Completed),
				slo(c.TTFTSLO, s), s(c.TTFT.P50), s(c.TTFT.P90), s(c.TTFT.P99),
				slo(c.TPOTSLO, ms), ms(c.TPOT.P50), ms(c.TPOT.P90), ms(c.TPOT.P99))...))
		}
	}
	return t
}

func (r *Result) refusalsTable() htmlTable {
	reasons, failures := map[string]bool{}, map[string]bool{}
	for _, row := range r.Rows {
		for k := range row.RefusalsByReason {
			reasons[k] = true
		}
		for k := range row.Failures {
			failures[k] = true
		}
	}
	rs, fs := slices.Sorted(maps.Keys(reasons)), slices.Sorted(maps.Keys(failures))
	t := htmlTable{ID: "refusals", Caption: "Refusals by reason, and failures", Head: []string{"policy", "load", "refused"}}
	for _, k := range rs {
		t.Head = append(t.Head, "refused: "+k)
	}
	t.Head = append(t.Head, "failed")
	for _, k := range fs {
		t.Head = append(t.Head, "failed: "+k)
	}
	for _, row := range r.Rows {
		line := append(runCells(row), cells(strconv.Itoa(row.Refused))...)
		for _, k := range rs {
			line = append(line, htmlCell{Text: strconv.Itoa(row.RefusalsByReason[k])})
		}
		line = append(line, htmlCell{Text: strconv.Itoa(row.Failed)})
		for _, k := range fs {
			line = append(line, htmlCell{Text: strconv.Itoa(row.Failures[k])})
		}
		t.Rows = append(t.Rows, line)
	}
	return t
}
