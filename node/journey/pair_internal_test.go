package journey

import (
	"testing"

	"github.com/kvmesh/kvmesh/admit/plan"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/node/metrics"
)

// TestDispatchOutcome pins kvmesh_route_disaggregated_total's outcome to the candidate
// admission chose, whatever the split rule put first: the decode node the rule chose counts
// for its reason, a pair as split, and a mixed node behind them as whole_no_pair, never for
// the decode node's reason.
func TestDispatchOutcome(t *testing.T) {
	d := route.Candidate{Name: "d"}
	m := route.Candidate{Name: "m"}
	m2 := route.Candidate{Name: "m2"}
	pair := route.Candidate{Name: "p", Pair: &route.Pair{}}
	local := route.PairSearch{Local: []route.Candidate{d}}
	tests := []struct {
		name   string
		why    string
		cands  []route.Candidate
		search route.PairSearch
		chosen int
		want   string
	}{
		{"the decode node the rule chose", route.WholeDecodeShort, []route.Candidate{d, pair, m}, local, 0, metrics.DisaggDecodeShort},
		{"the pair behind it", route.WholePrefillBehind, []route.Candidate{d, pair, m}, local, 1, metrics.DisaggSplit},
		{"a mixed node behind a short prompt's decode node", route.WholeDecodeShort, []route.Candidate{d, pair, m}, local, 2, metrics.DisaggWholeNoPair},
		{"a mixed node behind the prefill pool's decode node", route.WholePrefillBehind, []route.Candidate{d, m}, local, 1, metrics.DisaggWholeNoPair},
		{"a mixed node, the decode node shed", route.WholePrefillBehind, []route.Candidate{pair, m}, local, 1, metrics.DisaggWholeNoPair},
		{"the pair the rule chose", route.SplitFaster, []route.Candidate{pair, m}, route.PairSearch{}, 0, metrics.DisaggSplit},
		{"a mixed node behind the pair", route.SplitFaster, []route.Candidate{pair, m}, route.PairSearch{}, 1, metrics.DisaggWholeNoPair},
		{"a mixed node the rule chose", route.WholeShort, []route.Candidate{m, m2}, route.PairSearch{}, 0, metrics.DisaggWholeShort},
		{"the next mixed node", route.WholeMixedFast, []route.Candidate{m, m2}, route.PairSearch{}, 1, metrics.DisaggWholeMixed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pl := plan.Plan{Cands: tt.cands, Search: tt.search, SplitWhy: tt.why}
			if got := dispatchOutcome(&pl, tt.chosen); got != tt.want {
				t.Errorf("candidate %d (%s): %s, want %s", tt.chosen, tt.cands[tt.chosen].Name, got, tt.want)
			}
		})
	}
}
