package meshview

import (
	"testing"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/gossip"
)

// TestPoolRates pins which nodes' prefill rates size each waiting room pool: the decode nodes
// that run requests whole count in both pools while this node sends them whole requests, and
// not otherwise; a decode node that runs halves only never counts.
func TestPoolRates(t *testing.T) {
	m := []gossip.ModelInfo{{Name: "m"}}
	states := []gossip.State{
		{Role: "", Models: m, PrefillTokensPerSecond: 1000}, // the default role, mixed
		{Role: "prefill", Models: m, PrefillTokensPerSecond: 200},
		{Role: "decode", Models: m, PrefillTokensPerSecond: 30},
		{Role: "decode", Models: m, PrefillTokensPerSecond: 4, HalvesOnly: true},
		{Role: "", Models: []gossip.ModelInfo{{Name: "other"}}, PrefillTokensPerSecond: 50000},
	}
	for _, tc := range []struct {
		local          bool
		roles          []string
		whole, prefill float64
	}{
		{local: true, whole: 1030, prefill: 1230},
		{local: false, whole: 1000, prefill: 1200},
		{local: true, roles: []string{"mixed"}, whole: 1000, prefill: 1200}, // route.roles keeps decode nodes from whole requests
		{local: true, roles: []string{"decode"}, whole: 30, prefill: 1230},
	} {
		r := PoolRates(states, tc.local, tc.roles)
		if w, p := r[PoolKey{"m", ""}], r[PoolKey{"m", admit.RolePrefill}]; w != tc.whole || p != tc.prefill {
			t.Errorf("local %v, roles %v: whole pool %v, prefill pool %v tokens/s; want %v, %v", tc.local, tc.roles, w, p, tc.whole, tc.prefill)
		}
	}
	if o := PoolRates(states, true, nil)[PoolKey{"other", ""}]; o != 50000 {
		t.Errorf("model other's whole pool %v tokens/s, want 50000", o)
	}
}
