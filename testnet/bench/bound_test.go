package bench

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/testnet/loadgen"
)

// served is a synthetic request record: arrived at arrival (seconds since the run's start),
// its first token ttft later; met says whether it met its SLOs (a completed request that did
// not, when ttft > 0, a refusal when ttft is 0).
func served(class string, arrival, ttft float64, met bool) loadgen.RequestRecord {
	r := loadgen.RequestRecord{Class: class, Outcome: "completed", TTFTS: ttft, E2ES: ttft + 5, MetSLO: met}
	if ttft == 0 {
		r.Outcome, r.E2ES = "refused", 0.1
	}
	r.EndS = arrival + r.E2ES
	return r
}

// boundReport builds the report of recs, the classes' TTFT SLOs given in seconds (0: none).
func boundReport(recs []loadgen.RequestRecord, slo map[string]float64) *loadgen.Report {
	rep := &loadgen.Report{Classes: map[string]*loadgen.ClassReport{}}
	prio := map[string]int{"interactive": 0, "batch": -1}
	for _, r := range recs {
		c := rep.Classes[r.Class]
		if c == nil {
			c = &loadgen.ClassReport{Name: r.Class, Priority: prio[r.Class], TTFTSLO: slo[r.Class]}
			rep.Classes[r.Class] = c
		}
		c.Sent++
		rep.Sent++
		if r.MetSLO {
			c.Good++
			rep.Good++
		}
		c.Attainment = frac(c.Good, c.Sent)
	}
	return rep
}

// halfServed builds n requests of class arriving one a second from start, the even ones good with
// their first token ttft after arrival, the odd ones refused.
func halfServed(class string, start float64, n int, ttft float64) []loadgen.RequestRecord {
	var out []loadgen.RequestRecord
	for i := range n {
		if i%2 == 0 {
			out = append(out, served(class, start+float64(i), ttft, true))
		} else {
			out = append(out, served(class, start+float64(i), 0, false))
		}
	}
	return out
}

// allServedAt builds n good requests of class arriving at arrival, their first tokens every
// step seconds from first.
func allServedAt(class string, arrival float64, n int, first, step float64) []loadgen.RequestRecord {
	var out []loadgen.RequestRecord
	for i := range n {
		out = append(out, served(class, arrival, first+step*float64(i)-arrival, true))
	}
	return out
}

// TestBoundCountsServiceTheClassCouldUse pins down the bound: an ideal admission can spend on
// a class only the good requests whose first token came while one of the class's requests had
// arrived and could still meet its TTFT target.
func TestBoundCountsServiceTheClassCouldUse(t *testing.T) {
	slo := map[string]float64{"interactive": 2, "batch": 30}
	cat := func(parts ...[]loadgen.RequestRecord) []loadgen.RequestRecord {
		var out []loadgen.RequestRecord
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	for _, c := range []struct {
		name string
		recs []loadgen.RequestRecord
		slo  map[string]float64
		// bound and served per class, interactive then batch (served alone for one class)
		bound, servedBound []float64
	}{{
		// Interactive arrives over seconds 0–9 (target 2 s), half of it served; batch arrives
		// at 0 and is served in the drain, seconds 20–29: after the last interactive request's
		// target, so no admission could have given those first tokens to interactive.
		name:  "batch served after the window does not raise interactive's bound",
		recs:  cat(halfServed("interactive", 0, 10, 0.5), allServedAt("batch", 0, 10, 20, 1)),
		slo:   slo,
		bound: []float64{0.5, 1}, servedBound: []float64{1, 0.5},
	}, {
		// The same batch first tokens inside the window, each while a refused interactive
		// request could still have met its target, are capacity interactive could have had.
		name:  "batch served inside the window raises interactive's bound",
		recs:  cat(halfServed("interactive", 0, 10, 0.5), allServedAt("batch", 0, 5, 1.5, 2), allServedAt("batch", 0, 5, 11, 1)),
		slo:   slo,
		bound: []float64{1, 0.5}, servedBound: []float64{1, 0.5},
	}, {
		name:  "service before a class's requests arrive is not theirs",
		recs:  cat(allServedAt("batch", 0, 10, 0, 1), halfServed("interactive", 20, 10, 0.5)),
		slo:   slo,
		bound: []float64{0.5, 1}, servedBound: []float64{1, 0.5},
	}, {
		name: "one class: the good requests served, as before",
		recs: cat(halfServed("interactive", 0, 10, 0.5), []loadgen.RequestRecord{
			served("interactive", 3, 4, false), served("interactive", 50, 1, true)}),
		slo:   slo,
		bound: []float64{6.0 / 12}, servedBound: []float64{6.0 / 12},
	}, {
		name:  "a target spanning the run keeps the bound of the served",
		recs:  cat(halfServed("interactive", 0, 10, 0.5), allServedAt("batch", 0, 10, 20, 1)),
		slo:   map[string]float64{"interactive": 1000, "batch": 30},
		bound: []float64{1, 0.5}, servedBound: []float64{1, 0.5},
	}, {
		name:  "no target: the window has no end",
		recs:  cat(halfServed("interactive", 0, 10, 0.5), allServedAt("batch", 0, 10, 20, 1)),
		slo:   map[string]float64{"batch": 30},
		bound: []float64{1, 0.5}, servedBound: []float64{1, 0.5},
	}} {
		t.Run(c.name, func(t *testing.T) {
			rep := boundReport(c.recs, c.slo)
			b := Bounds(rep, c.recs)
			if len(b) != len(c.bound) {
				t.Fatalf("bounds %+v: want %d classes", b, len(c.bound))
			}
			for i := range b {
				if !near(b[i].Bound, c.bound[i]) || !near(b[i].BoundServed, c.servedBound[i]) {
					t.Errorf("%s: bound %.3f served %.3f, want %.3f, %.3f", b[i].Class, b[i].Bound, b[i].BoundServed, c.bound[i], c.servedBound[i])
				}
				if !near(b[i].Ratio, ratioTo(b[i].Attainment, c.bound[i])) || !near(b[i].RatioServed, ratioTo(b[i].Attainment, c.servedBound[i])) {
					t.Errorf("%s: ratio %.3f served %.3f", b[i].Class, b[i].Ratio, b[i].RatioServed)
				}
			}
			if nil := Bounds(rep, nil); nil[0].Bound != nil[0].BoundServed {
				t.Errorf("without records the bound is the served one: %+v", nil[0])
			}
		})
	}
}

// TestBoundJSON checks both bounds reach the JSON, the row's interactive figures are the new
// bound's and the table prints it.
func TestBoundJSON(t *testing.T) {
	recs := append(halfServed("interactive", 0, 10, 0.5), allServedAt("batch", 0, 10, 20, 1)...)
	rep := boundReport(recs, map[string]float64{"interactive": 2, "batch": 30})
	r := newRow("kvmesh", 1.5, rep, recs, 1, "interactive")
	if !near(r.HighBound, 0.5) || !near(r.HighBoundRatio, 1) {
		t.Errorf("row's interactive bound %.3f ratio %.3f, want 0.5, 1", r.HighBound, r.HighBoundRatio)
	}
	js, err := json.Marshal(r.Bounds[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"bound":0.5`, `"ratio":1`, `"bound_served":1`, `"ratio_served":0.5`} {
		if !strings.Contains(string(js), want) {
			t.Errorf("JSON %s lacks %s", js, want)
		}
	}
	var table strings.Builder
	if err := (&Result{Interactive: "interactive", Rows: []Row{r}}).WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`interactive +10 +5 +` + regexp.QuoteMeta(pct(0.5)) + ` +` + regexp.QuoteMeta(pct(0.5)) + ` +1\.00\n`)
	if !line.MatchString(table.String()) {
		t.Errorf("table lacks %s:\n%s", line, table.String())
	}
}
