package bench

import (
	"math"
	"testing"
)

// curveStep is a probe step of a synthetic baseline whose SLO attainment at rate is att(rate).
func curveStep(att func(rate float64) float64) func(rate float64) (ProbeStep, error) {
	return func(rate float64) (ProbeStep, error) {
		a := min(max(att(rate), 0), 1)
		sent := int(rate * 100)
		return ProbeStep{OfferedRPS: rate, Sent: sent, Good: int(a * float64(sent)), Attainment: a}, nil
	}
}

// TestProbeSearch pins the probe's rule on synthetic steps: on a workload with a knee (its
// attainment falls steeply past the engines' saturation) the capacity is the attainment
// threshold's, as with the threshold alone; on one whose attainment is flat in load (it falls
// slowly from the start, and goodput grows until the engines saturate at 35 req/s) it is where
// goodput's growth falls under ProbeGrowth of the added load (30 req/s), not where attainment
// first dips under the threshold (11.57 req/s).
func TestProbeSearch(t *testing.T) {
	knee := func(r float64) float64 {
		if r <= 20 {
			return 0.98
		}
		return 0.98 - (r-20)/20 // attainment falls by 1 per 100% past the knee
	}
	flat := func(r float64) float64 {
		const saturation = 35.0
		if r <= saturation {
			return 0.95 - 0.004*r
		}
		return saturation * (0.95 - 0.004*saturation) / r // goodput flat past saturation
	}
	tests := []struct {
		name      string
		att       func(float64) float64
		start     float64
		threshold float64 // the capacity the attainment threshold alone finds
		want      float64
	}{
		{"a knee: the threshold's capacity", knee, 10, 20, 20},
		{"flat attainment: where goodput stops growing", flat, 7.5, 7.5 * math.Pow(2, 5.0/8), 30},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			old, err := searchKnee(tt.start, 3, func(rate float64) (bool, error) {
				st, _ := curveStep(tt.att)(rate)
				return st.Attainment >= 0.9, nil
			})
			if err != nil || math.Abs(old-tt.threshold) > 1e-9 {
				t.Fatalf("threshold alone: %g, %v, want %g", old, err, tt.threshold)
			}
			got, steps, err := probeSearch(tt.start, 3, 0.9, curveStep(tt.att))
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("capacity %g, want %g (steps %+v)", got, tt.want, steps)
			}
			for _, st := range steps {
				if st.ByGrowth && (!st.Met || st.Attainment >= 0.9) {
					t.Errorf("step %+v: met by growth means met under the threshold", st)
				}
			}
		})
	}
}

// TestProbeMet pins one step's judgement.
func TestProbeMet(t *testing.T) {
	ref := &ProbeStep{OfferedRPS: 10, Sent: 100, Attainment: 0.95}
	tests := []struct {
		name          string
		st            ProbeStep
		ref           *ProbeStep
		met, byGrowth bool
	}{
		{"at the threshold", ProbeStep{OfferedRPS: 20, Sent: 200, Attainment: 0.9}, ref, true, false},
		{"nothing sent", ProbeStep{OfferedRPS: 20, Attainment: 1}, ref, false, false},
		{"under it, goodput grew by over 3/4 of the added load", ProbeStep{OfferedRPS: 20, Sent: 200, Attainment: 0.87}, ref, true, true},
		{"under it, goodput grew by less", ProbeStep{OfferedRPS: 20, Sent: 200, Attainment: 0.8}, ref, false, false},
		{"under the band", ProbeStep{OfferedRPS: 100, Sent: 1000, Attainment: 0.74}, ref, false, false},
		{"no step met before", ProbeStep{OfferedRPS: 20, Sent: 200, Attainment: 0.85}, nil, false, false},
		{"not above the step met", ProbeStep{OfferedRPS: 8, Sent: 80, Attainment: 0.85}, ref, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			met, by := probeMet(tt.st, tt.ref, 0.9)
			if met != tt.met || by != tt.byGrowth {
				t.Errorf("probeMet = %v, %v; want %v, %v", met, by, tt.met, tt.byGrowth)
			}
		})
	}
}
