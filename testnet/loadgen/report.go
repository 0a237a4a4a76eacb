package loadgen

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// WriteTable writes a human-readable summary of r.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	p := func(format string, a ...any) { fmt.Fprintf(tw, format, a...) }
	p("workload\t%s\tseed %d\ttargets %d\n", r.Workload, r.Seed, len(r.Targets))
	p("time\twindow %.1fs\telapsed %.1fs\toffered %.2f req/s\n", r.Window, r.Elapsed, r.OfferedRate)
	if r.TraceEnded {
		p("trace\tran out of requests at %.1fs, before the duration\n", r.Window)
	}
	p("requests\tsent %d\tcompleted %d\trefused %d\tfailed %d\tretried %d (%d completed)\n",
		r.Sent, r.Completed, r.Refused, r.Failed, r.Retried, r.RetriedCompleted)
	p("goodput\t%d met SLO\t%.2f req/s\t%.1f%% of sent\n", r.Good, r.Goodput, 100*r.Attainment)
	if r.CompletedInWindow != r.Completed {
		p("in window\t%d completed\t%.2f req/s\t%d output tokens\n", r.CompletedInWindow, ratio(float64(r.CompletedInWindow), r.Window), r.OutputTokensInWindow)
	}
	p("tokens\toutput %d\t%.1f tok/s\tprompt %d\tcached %d (%.1f%%)\n",
		r.OutputTokens, r.OutputTokensPerSec, r.PromptTokens, r.CachedTokens, 100*r.CachedRatio)
	p("\nlatency (ms)\tp50\tp90\tp99\tmax\tmean\tcount\n")
	for _, l := range []struct {
		name string
		p    Percentiles
	}{{"TTFT", r.TTFT}, {"TPOT", r.TPOT}, {"ITL", r.ITL}, {"E2E", r.E2E}} {
		ms := func(s float64) string { return fmt.Sprintf("%.1f", 1000*s) }
		p("%s\t%s\t%s\t%s\t%s\t%s\t%d\n", l.name, ms(l.p.P50), ms(l.p.P90), ms(l.p.P99), ms(l.p.Max), ms(l.p.Mean), l.p.Count)
	}
	p("\nclass\tpriority\tTTFT SLO\tTPOT SLO\tsent\tcompleted\trefused\tfailed\tgood\tattainment\tp99 TTFT\n")
	for _, name := range slices.Sorted(maps.Keys(r.Classes)) {
		c := r.Classes[name]
		p("%s\t%d\t%gs\t%gs\t%d\t%d\t%d\t%d\t%d\t%.1f%%\t%.1fms\n", c.Name, c.Priority, c.TTFTSLO, c.TPOTSLO,
			c.Sent, c.Completed, c.Refused, c.Failed, c.Good, 100*c.Attainment, 1000*c.TTFT.P99)
	}
	p("\nkind\tsent\tcompleted\trefused\tfailed\tgood\tattainment\tp99 TTFT\tp99 E2E\n")
	for _, name := range slices.Sorted(maps.Keys(r.Kinds)) {
		k := r.Kinds[name]
		p("%s\t%d\t%d\t%d\t%d\t%d\t%.1f%%\t%.1fms\t%.1fms\n", name, k.Sent, k.Completed, k.Refused, k.Failed, k.Good,
			100*k.Attainment, 1000*k.TTFT.P99, 1000*k.E2E.P99)
	}
	if len(r.Entries) > 0 {
		p("\nentry\tsent\tcompleted\trefused\tfailed\tgood\tattainment\tcache hit\tp50 TTFT\tp99 TTFT\n")
		for _, name := range slices.Sorted(maps.Keys(r.Entries)) {
			e := r.Entries[name]
			p("%s\t%d\t%d\t%d\t%d\t%d\t%.1f%%\t%.1f%%\t%.1fms\t%.1fms\n", name, e.Sent, e.Completed, e.Refused, e.Failed, e.Good,
				100*e.Attainment, 100*e.CachedRatio, 1000*e.TTFT.P50, 1000*e.TTFT.P99)
		}
	}
	p("\n")
	for _, m := range []struct {
		name string
		m    map[string]int
	}{{"refusals by status", r.RefusalsByStatus}, {"refusals by reason", r.RefusalsByReason},
		{"failures", r.Failures}, {"served by node", r.Nodes}} {
		if len(m.m) == 0 {
			continue
		}
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(m.m)) {
			parts = append(parts, fmt.Sprintf("%s %d", k, m.m[k]))
		}
		p("%s\t%s\n", m.name, strings.Join(parts, ", "))
	}
	if r.RetryAfterSeen > 0 {
		p("retry-after\t%d seen, mean %.2fs\n", r.RetryAfterSeen, r.RetryAfterMean)
	}
	return tw.Flush()
}

// LoadPoint is one run in a plot: a series (a policy) at an offered load.
type LoadPoint struct {
	Series string `json:"series"`
	// Load is the offered load, in whatever unit the caller sweeps (req/s or × capacity).
	Load    float64 `json:"load"`
	Goodput float64 `json:"goodput_rps"`
	P99TTFT float64 `json:"p99_ttft_s"`
}

// Point returns r as a LoadPoint of series at load.
func (r *Report) Point(series string, load float64) LoadPoint {
	return LoadPoint{Series: series, Load: load, Goodput: r.Goodput, P99TTFT: r.TTFT.P99}
}

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// finite maps NaN, infinities and negatives to 0 so a bad point cannot break the drawing.
func finite(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0
	}
	return v
}

// niceMax rounds v up to 1, 2 or 5 times a power of ten (1 for v ≤ 0).
func niceMax(v float64) float64 {
	if v <= 0 {
		return 1
	}
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*e {
			return m * e
		}
	}
	return 10 * e
}

func tick(v float64) string { return fmt.Sprintf("%.3g", v) }

func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

// TimelineSeries is one line of a TimelinePanel: a value per step of the x axis.
type TimelineSeries struct {
	Name   string
	Values []float64
	// Color indexes the palette, so related series (accepted and refused of one pool) can share
	// one; Dashed tells them apart.
	Color  int
	Dashed bool
}

// TimelinePanel is one run's panel of WriteTimelineSVG.
type TimelinePanel struct {
	Title  string
	Series []TimelineSeries
}

// WriteTimelineSVG writes a self-contained SVG of panels, cols to a row, each plotting its series
// against the step index (xLabel), all on the same axes so panels compare; the legend lists
// every series name once.
func WriteTimelineSVG(w io.Writer, panels []TimelinePanel, cols int, xLabel string) error {
	const (
		panelW, panelH = 420.0, 200.0
		left, top      = 60.0, 40.0
		gapX, gapY     = 60.0, 80.0
		legendH        = 20.0
	)
	cols = max(1, min(cols, len(panels)))
	rows := (len(panels) + cols - 1) / cols
	xmax, ymax := 0.0, 0.0
	type entry struct {
		color  int
		dashed bool
	}
	var names []string
	legend := map[string]entry{}
	for _, p := range panels {
		for _, s := range p.Series {
			xmax = max(xmax, float64(len(s.Values)))
			for _, v := range s.Values {
				ymax = max(ymax, finite(v))
			}
			if _, ok := legend[s.Name]; !ok {
				names = append(names, s.Name)
				legend[s.Name] = entry{s.Color, s.Dashed}
			}
		}
	}
	xs, ys := niceMax(xmax), niceMax(ymax)
	width := left + float64(cols)*(panelW+gapX)
	height := top + float64(rows)*(panelH+gapY) + legendH*float64((len(names)+3)/4)
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n",
		width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	dash := func(d bool) string {
		if d {
			return ` stroke-dasharray="5,3"`
		}
		return ""
	}
	for i, p := range panels {
		x0 := left + float64(i%cols)*(panelW+gapX)
		y0 := top + float64(i/cols)*(panelH+gapY)
		px := func(v float64) float64 { return x0 + v/xs*panelW }
		py := func(v float64) float64 { return y0 + panelH - finite(v)/ys*panelH }
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="14">%s</text>`+"\n", x0+panelW/2, y0-10, esc(p.Title))
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#444"/>`+"\n", x0, y0, panelW, panelH)
		for t := 0; t <= 4; t++ {
			f := float64(t) / 4
			gy := y0 + panelH - f*panelH
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", x0, gy, x0+panelW, gy)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", x0-5, gy+4, esc(tick(f*ys)))
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x0+f*panelW, y0+panelH+16, esc(tick(f*xs)))
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x0+panelW/2, y0+panelH+32, esc(xLabel))
		for _, s := range p.Series {
			pts := make([]string, len(s.Values))
			for j, v := range s.Values {
				pts[j] = fmt.Sprintf("%.1f,%.1f", px(float64(j)), py(v))
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5"%s points="%s"><title>%s</title></polyline>`+"\n",
				palette[s.Color%len(palette)], dash(s.Dashed), strings.Join(pts, " "), esc(s.Name))
		}
	}
	for i, name := range names {
		e := legend[name]
		lx := left + float64(i%4)*200
		ly := top + float64(rows)*(panelH+gapY) + legendH*float64(i/4) - gapY/2 + 20
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"%s/>`+"\n", lx, ly-4, lx+24, ly-4, palette[e.color%len(palette)], dash(e.dashed))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", lx+30, ly, esc(name))
	}
	b.WriteString("</svg>\n")
	_, err := w.Write(b.Bytes())
	return err
}
