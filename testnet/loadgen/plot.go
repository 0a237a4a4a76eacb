package loadgen

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strings"
)

// PanelPoint is one run in a LoadPanel: a series (a policy) at an offered load.
type PanelPoint struct {
	Series string
	Load   float64
	Value  float64
}

// LoadPanel is one panel of WriteLoadPanelsSVG: a value against offered load, a line per
// series. Ref, when positive, draws a dashed horizontal line labelled RefLabel (an SLO).
type LoadPanel struct {
	Title    string
	Points   []PanelPoint
	Ref      float64
	RefLabel string
}

// WriteSVG writes a self-contained SVG with two panels, goodput and p99 TTFT against offered
// load, one line per series (in order of first appearance, points sorted by load).
func WriteSVG(w io.Writer, points []LoadPoint) error {
	good := LoadPanel{Title: "goodput (req/s)"}
	ttft := LoadPanel{Title: "p99 TTFT (s)"}
	for _, p := range points {
		good.Points = append(good.Points, PanelPoint{p.Series, p.Load, p.Goodput})
		ttft.Points = append(ttft.Points, PanelPoint{p.Series, p.Load, p.P99TTFT})
	}
	return WriteLoadPanelsSVG(w, "goodput and p99 TTFT against offered load", []LoadPanel{good, ttft}, 2)
}

// WriteLoadPanelsSVG writes a self-contained SVG titled title (its <title>, for screen readers)
// of panels, cols to a row, each with its own value axis and all against offered load on the
// same axis. A series keeps its colour in every panel (colours in order of first appearance,
// points sorted by load) and the legend lists it once; every point carries a <title> naming
// its panel, series, load and value.
func WriteLoadPanelsSVG(w io.Writer, title string, panels []LoadPanel, cols int) error {
	const (
		panelW, panelH = 420.0, 260.0
		left, top      = 60.0, 40.0
		gapX, gapY     = 90.0, 80.0
		legendH        = 20.0
	)
	var series []string
	xmax := 0.0
	for _, pn := range panels {
		for _, p := range pn.Points {
			if !slices.Contains(series, p.Series) {
				series = append(series, p.Series)
			}
			xmax = max(xmax, finite(p.Load))
		}
	}
	cols = max(1, min(cols, len(panels)))
	rows := max(1, (len(panels)+cols-1)/cols)
	width := left + float64(cols)*(panelW+gapX) - gapX + 20
	legendY := top + float64(rows)*(panelH+gapY) - gapY + 55
	height := legendY + legendH*float64((len(series)+2)/3)
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" role="img" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n",
		width, height, width, height)
	fmt.Fprintf(&b, "<title>%s</title>\n", esc(title))
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	xs := niceMax(xmax)
	for i, pn := range panels {
		x0 := left + float64(i%cols)*(panelW+gapX)
		y0 := top + float64(i/cols)*(panelH+gapY)
		ymax := finite(pn.Ref)
		for _, p := range pn.Points {
			ymax = max(ymax, finite(p.Value))
		}
		ys := niceMax(ymax)
		px := func(v float64) float64 { return x0 + finite(v)/xs*panelW }
		py := func(v float64) float64 { return y0 + panelH - finite(v)/ys*panelH }
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="14">%s</text>`+"\n", x0+panelW/2, y0-15, esc(pn.Title))
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#444"/>`+"\n", x0, y0, panelW, panelH)
		for t := 0; t <= 5; t++ {
			f := float64(t) / 5
			gx, gy := x0+f*panelW, y0+panelH-f*panelH
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", x0, gy, x0+panelW, gy)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", x0-5, gy+4, esc(tick(f*ys)))
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", gx, y0+panelH+16, esc(tick(f*xs)))
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">offered load</text>`+"\n", x0+panelW/2, y0+panelH+34)
		if pn.Ref > 0 {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333" stroke-dasharray="6,4"><title>%s</title></line>`+"\n",
				x0, py(pn.Ref), x0+panelW, py(pn.Ref), esc(pn.RefLabel))
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" fill="#333">%s</text>`+"\n", x0+panelW-4, py(pn.Ref)-4, esc(pn.RefLabel))
		}
		writeLoadSeries(&b, pn, series, px, py)
	}
	for si, s := range series {
		lx := left + float64(si%3)*250
		ly := legendY + legendH*float64(si/3)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="14" height="4" fill="%s"/>`+"\n", lx, ly-4, palette[si%len(palette)])
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", lx+20, ly, esc(s))
	}
	b.WriteString("</svg>\n")
	_, err := w.Write(b.Bytes())
	return err
}

// writeLoadSeries draws pn's points, a polyline and a titled dot each, coloured by their
// series' index in series.
func writeLoadSeries(b *bytes.Buffer, pn LoadPanel, series []string, px, py func(float64) float64) {
	for si, s := range series {
		var pts []PanelPoint
		for _, p := range pn.Points {
			if p.Series == s {
				pts = append(pts, p)
			}
		}
		if len(pts) == 0 {
			continue
		}
		slices.SortStableFunc(pts, func(a, b PanelPoint) int { return cmpFloat(a.Load, b.Load) })
		color := palette[si%len(palette)]
		coords := make([]string, len(pts))
		for i, p := range pts {
			coords[i] = fmt.Sprintf("%.1f,%.1f", px(p.Load), py(p.Value))
		}
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", color, strings.Join(coords, " "))
		for _, p := range pts {
			fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s: %s at load %s: %s</title></circle>`+"\n",
				px(p.Load), py(p.Value), color, esc(pn.Title), esc(s), esc(tick(p.Load)), esc(tick(p.Value)))
		}
	}
}
