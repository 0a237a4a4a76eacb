package loadgen

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"strings"
	"testing"
	"time"
)

func sampleReport() *Report {
	c := newCollector()
	cls := DefaultInteractive
	c.add(&Result{Kind: KindRAG, Class: cls, Outcome: Completed, TTFT: 100 * time.Millisecond, E2E: 300 * time.Millisecond, OutputTokens: 3, Node: "n1"}, true)
	c.add(&Result{Class: DefaultBatch, Outcome: Refused, Status: 429, Reason: "queue_full", HasRetryAfter: true, RetryAfter: time.Second}, true)
	c.add(&Result{Class: cls, Outcome: Failed, Failure: FailTruncated}, true)
	r := c.report(time.Second, 2*time.Second)
	r.Workload, r.Seed, r.Targets = "mixed", 3, []string{"http://a"}
	return r
}

func TestReportJSONFieldNames(t *testing.T) {
	b, err := json.Marshal(sampleReport())
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"workload", "sent", "completed", "refused", "failed", "good", "goodput_rps", "slo_attainment",
		"ttft", "tpot", "itl", "e2e", "classes", "kinds", "refusals_by_status", "refusals_by_reason", "failures", "nodes", "cached_ratio",
		"output_tokens_per_s", "retry_after_mean_s", "offered_rps"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
	if p99 := m["ttft"].(map[string]any)["p99_s"]; p99 != 0.1 {
		t.Errorf("ttft.p99_s = %v", p99)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil || back.Refused != 1 || back.Classes["batch"].Refused != 1 {
		t.Fatalf("round trip: %v %+v", err, back)
	}
}

func TestWriteTable(t *testing.T) {
	var b bytes.Buffer
	if err := sampleReport().WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"sent 3", "completed 1", "refused 1", "failed 1", "TTFT", "100.0", "interactive",
		"batch", "rag", "429 1", "queue_full 1", "truncated 1", "n1 1", "retry-after"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

func TestWriteSVGWellFormed(t *testing.T) {
	points := []LoadPoint{
		{Series: "kvmesh", Load: 1.5, Goodput: 9, P99TTFT: 1.2},
		{Series: "kvmesh", Load: 0.5, Goodput: 4, P99TTFT: 0.3},
		{Series: "cache-aware <no admission> & co", Load: 0.5, Goodput: 4, P99TTFT: 0.4},
		{Series: "cache-aware <no admission> & co", Load: 1.5, Goodput: 2, P99TTFT: math.Inf(1)},
		{Series: "round-robin", Load: math.NaN(), Goodput: -1, P99TTFT: 0},
	}
	for _, pts := range [][]LoadPoint{points, nil} {
		var b bytes.Buffer
		if err := WriteSVG(&b, pts); err != nil {
			t.Fatal(err)
		}
		elems, texts := svgTokens(t, b.Bytes())
		polylines := 0
		for _, el := range elems {
			if el.Name.Local == "polyline" {
				polylines++
			}
		}
		series := map[string]bool{}
		for _, p := range pts {
			series[p.Series] = true
		}
		if polylines != 2*len(series) {
			t.Errorf("%d polylines for %d series in two panels", polylines, len(series))
		}
		if len(pts) > 0 && !strings.Contains(strings.Join(texts, "|"), "|cache-aware <no admission> & co|") {
			t.Error("legend does not carry the escaped series name")
		}
	}
}

// TestWriteTimelineSVG pins the timeline plot's shape: well-formed, one polyline per series,
// each name once in the legend, dashed series dashed.
func TestWriteTimelineSVG(t *testing.T) {
	panels := []TimelinePanel{
		{Title: "a <1>", Series: []TimelineSeries{{Name: "prefill accepted", Values: []float64{1, 3, 2}}, {Name: "prefill refused", Values: []float64{0, 1, math.NaN()}, Dashed: true}}},
		{Title: "b", Series: []TimelineSeries{{Name: "mixed accepted", Values: []float64{2, 2}, Color: 2}}},
		{Title: "c", Series: []TimelineSeries{{Name: "prefill accepted", Values: []float64{4}}}},
	}
	var b bytes.Buffer
	if err := WriteTimelineSVG(&b, panels, 2, "second"); err != nil {
		t.Fatal(err)
	}
	elems, chars := svgTokens(t, b.Bytes())
	polylines, dashed, texts := 0, 0, map[string]int{}
	for _, el := range elems {
		if el.Name.Local == "polyline" {
			polylines++
		}
		for _, a := range el.Attr {
			if a.Name.Local == "stroke-dasharray" {
				dashed++
			}
		}
	}
	for _, c := range chars {
		texts[c]++
	}
	if polylines != 4 || dashed != 2 { // the refused polyline and its legend line
		t.Errorf("%d polylines, %d dashed; want 4 and 2", polylines, dashed)
	}
	// Each name titles its polylines and appears once in the legend.
	if texts["prefill accepted"] != 3 || texts["mixed accepted"] != 2 || texts["a <1>"] != 1 {
		t.Errorf("texts %v", texts)
	}
}

// svgTokens returns b's elements and text, failing unless b is well-formed XML with an svg root.
func svgTokens(t *testing.T, b []byte) (elems []xml.StartElement, texts []string) {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(b))
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			elems = append(elems, el.Copy())
		case xml.CharData:
			texts = append(texts, string(el))
		}
	}
	if len(elems) == 0 || elems[0].Name.Local != "svg" {
		t.Fatalf("no svg root element")
	}
	return elems, texts
}

func TestReportPoint(t *testing.T) {
	r := sampleReport()
	p := r.Point("kvmesh", 1.5)
	if p.Series != "kvmesh" || p.Load != 1.5 || p.Goodput != r.Goodput || p.P99TTFT != 0.1 {
		t.Fatalf("point %+v", p)
	}
}
