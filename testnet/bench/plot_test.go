package bench

import (
	"bytes"
	"encoding/xml"
	"io"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/testnet/loadgen"
)

// handReport is a run of two classes whose TTFTs are two orders of magnitude apart: the
// interactive class's p99 is interactiveP99 and the batch class's 20 s, which is also the
// p99 over both.
func handReport(interactiveP99 float64) *loadgen.Report {
	class := func(name string, prio int, slo, p99 float64, sent, good int) *loadgen.ClassReport {
		return &loadgen.ClassReport{Name: name, Priority: prio, TTFTSLO: slo, TPOTSLO: slo / 20, GroupReport: loadgen.GroupReport{
			Sent: sent, Completed: sent - 2, Refused: 2, Good: good, Attainment: float64(good) / float64(sent),
			TTFT: loadgen.Percentiles{Count: sent - 2, P50: p99 / 4, P90: p99 / 2, P99: p99},
			TPOT: loadgen.Percentiles{Count: sent - 2, P50: 0.02, P90: 0.03, P99: 0.04},
		}}
	}
	inter := class("interactive", 0, 2, interactiveP99, 43, 42)
	batch := class("batch", -1, 30, 20, 20, 11)
	return &loadgen.Report{
		Sent: 63, Completed: 59, Refused: 4, Good: 53, Goodput: 5.3, Attainment: 53.0 / 63,
		TTFT: loadgen.Percentiles{Count: 59, P50: 0.1, P99: 20}, TPOT: loadgen.Percentiles{Count: 59, P99: 0.04},
		CachedRatio: 0.4, Classes: map[string]*loadgen.ClassReport{"interactive": inter, "batch": batch},
		RefusalsByReason: map[string]int{"queue_full": 3, "slo<unmeetable>&": 1}, Failures: map[string]int{"timeout": 0},
	}
}

// handResult is two policies at two loads, built from handReport without running anything.
func handResult() *Result {
	res := &Result{Nodes: 3, TimeScale: 1, Workload: "mixed", Loads: []float64{0.5, 1.5}, Interactive: "interactive",
		Capacity: 10, BaselineScheduling: "priority", Seed: 1, Duration: 60, KVBlocks: 512}
	for i, p := range []string{"kvmesh", "cache-aware"} {
		res.Policies = append(res.Policies, Policy{Name: p, EngineScheduling: "priority"})
		for _, l := range res.Loads {
			res.Rows = append(res.Rows, newRow(p, l, handReport(0.2+float64(i)), nil, 1, "interactive"))
		}
	}
	res.Ratios = Ratios(res.Rows)
	return res
}

// svgPointTitles returns the <title> of every <circle> (plotted point) of an SVG.
func svgPointTitles(t *testing.T, b []byte) []string {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(b))
	var out []string
	inCircle := false
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if tok.Name.Local == "circle" {
				inCircle = true
			}
			if tok.Name.Local == "title" && inCircle {
				var s string
				if err := d.DecodeElement(&s, &tok); err != nil {
					t.Fatal(err)
				}
				out = append(out, s)
			}
		case xml.EndElement:
			if tok.Name.Local == "circle" {
				inCircle = false
			}
		}
	}
}

// TestSVGKeepsClassesApart pins that the plot draws each class's p99 TTFT on its own panel:
// the interactive class's 0.2 s is a point of its own, not hidden under the batch class's
// 20 s in a p99 over both.
func TestSVGKeepsClassesApart(t *testing.T) {
	res := handResult()
	var svg bytes.Buffer
	if err := res.WriteSVG(&svg); err != nil {
		t.Fatal(err)
	}
	checkXML(t, svg.Bytes())
	titles := strings.Join(svgPointTitles(t, svg.Bytes()), "\n")
	for _, want := range []string{
		"p99 TTFT of interactive (s): kvmesh at load 1.5: 0.2",
		"p99 TTFT of interactive (s): cache-aware at load 0.5: 1.2",
		"p99 TTFT of batch (s): kvmesh at load 1.5: 20",
		"goodput (req/s): cache-aware at load 1.5: 5.3",
	} {
		if !strings.Contains(titles, want) {
			t.Errorf("no point %q among:\n%s", want, titles)
		}
	}
	for _, title := range strings.Split(titles, "\n") {
		if strings.Contains(title, "TTFT") && !strings.Contains(title, "interactive") && !strings.Contains(title, "batch") {
			t.Errorf("point %q mixes the classes", title)
		}
	}
	if n := strings.Count(svg.String(), ">SLO 2s</text>") + strings.Count(svg.String(), ">SLO 30s</text>"); n != 2 {
		t.Errorf("%d SLO lines, want one per class panel", n)
	}
	if !strings.Contains(svg.String(), `role="img"`) || !strings.Contains(svg.String(), "<title>kvmesh bench") {
		t.Error("the SVG has no accessible title")
	}
}
