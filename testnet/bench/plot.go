package bench

import (
	"fmt"
	"io"
	"slices"

	"github.com/kvmesh/kvmesh/testnet/loadgen"
)

// classOrder returns the classes of r's rows, each once, in the order the rows list them
// (priority order, highest first).
func (r *Result) classOrder() []string {
	var out []string
	for _, row := range r.Rows {
		for _, c := range row.Classes {
			if !slices.Contains(out, c.Class) {
				out = append(out, c.Class)
			}
		}
	}
	return out
}

// classPanel returns one panel per class of r, a line per policy, plotting val of the class
// in each row against load; ref, when set, gives the panel's reference line (an SLO).
func (r *Result) classPanels(title string, val func(ClassRow) float64, ref func(ClassRow) (float64, string)) []loadgen.LoadPanel {
	var out []loadgen.LoadPanel
	for _, class := range r.classOrder() {
		pn := loadgen.LoadPanel{Title: fmt.Sprintf(title, class)}
		for _, row := range r.Rows {
			for _, c := range row.Classes {
				if c.Class != class {
					continue
				}
				pn.Points = append(pn.Points, loadgen.PanelPoint{Series: row.Policy, Load: row.Load, Value: val(c)})
				if ref != nil {
					if v, label := ref(c); v > pn.Ref {
						pn.Ref, pn.RefLabel = v, label
					}
				}
			}
		}
		out = append(out, pn)
	}
	return out
}

// ttftPanels returns the goodput panel and one p99 TTFT panel per class, each with the class's
// TTFT SLO as its reference line: classes whose SLOs differ by an order of magnitude each get
// their own axis.
func (r *Result) ttftPanels() []loadgen.LoadPanel {
	good := loadgen.LoadPanel{Title: "goodput (req/s)"}
	for _, row := range r.Rows {
		good.Points = append(good.Points, loadgen.PanelPoint{Series: row.Policy, Load: row.Load, Value: row.GoodputRPS})
	}
	ttft := r.classPanels("p99 TTFT of %s (s)",
		func(c ClassRow) float64 { return c.TTFT.P99 },
		func(c ClassRow) (float64, string) { return c.TTFTSLO, fmt.Sprintf("SLO %gs", c.TTFTSLO) })
	return append([]loadgen.LoadPanel{good}, ttft...)
}

// WriteSVG writes goodput and each class's p99 TTFT against offered load in multiples of
// capacity, a panel each and a line per policy, in simulated time.
func (r *Result) WriteSVG(w io.Writer) error {
	return loadgen.WriteLoadPanelsSVG(w, "kvmesh bench: goodput and p99 TTFT per class against offered load", r.ttftPanels(), 2)
}

// WritePoolSVG writes, per run with a per-pool timeline, the requests each pool accepted
// (solid) and refused (dashed) per simulated second; runs at one load side by side.
func (r *Result) WritePoolSVG(w io.Writer) error {
	var panels []loadgen.TimelinePanel
	cols := 0
	for _, l := range r.Loads {
		n := 0
		for _, row := range r.Rows {
			if row.Load != l || row.Pools == nil {
				continue
			}
			n++
			pn := loadgen.TimelinePanel{Title: fmt.Sprintf("%s at %g× capacity", row.Policy, row.Load)}
			for ci, name := range poolOrder {
				t := row.Pools[name]
				if t == nil {
					continue
				}
				pn.Series = append(pn.Series,
					loadgen.TimelineSeries{Name: name + " accepted", Values: floats(t.AcceptedPerSecond), Color: ci},
					loadgen.TimelineSeries{Name: name + " refused", Values: floats(t.RefusedPerSecond), Color: ci, Dashed: true})
			}
			panels = append(panels, pn)
		}
		cols = max(cols, n)
	}
	return loadgen.WriteTimelineSVG(w, panels, cols, "second (simulated)")
}

func floats(v []int) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}
