package node

import (
	"testing"
	"time"

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
		r := poolRates(states, tc.local, tc.roles)
		if w, p := r[poolKey{"m", ""}], r[poolKey{"m", admit.RolePrefill}]; w != tc.whole || p != tc.prefill {
			t.Errorf("local %v, roles %v: whole pool %v, prefill pool %v tokens/s; want %v, %v", tc.local, tc.roles, w, p, tc.whole, tc.prefill)
		}
	}
	if o := poolRates(states, true, nil)[poolKey{"other", ""}]; o != 50000 {
		t.Errorf("model other's whole pool %v tokens/s, want 50000", o)
	}
}

// TestPoolCapsFollowTheMesh pins the waiting room's token caps as nodes come and go: each pool's
// cap is its target TTFT times the rate of the nodes that serve it, and a pool whose nodes left
// falls back to queue.fallback_tokens rather than keep the cap it had.
func TestPoolCapsFollowTheMesh(t *testing.T) {
	n, err := New(standalone())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Shutdown(t.Context()) })
	q := n.adm.Config().Queue
	target, prefillTarget := time.Duration(q.TargetTTFT).Seconds(), time.Duration(q.PrefillTargetTTFT).Seconds()
	caps := func() map[admit.PoolCap]bool {
		out := map[admit.PoolCap]bool{}
		for _, c := range n.adm.Room().PoolCaps() {
			out[c] = true
		}
		return out
	}
	m := []gossip.ModelInfo{{Name: "m"}}
	mixed := gossip.State{Models: m, PrefillTokensPerSecond: 1000}
	prefill := gossip.State{Role: "prefill", Models: m, PrefillTokensPerSecond: 3000}
	for _, step := range []struct {
		states         []gossip.State
		whole, prefill int
	}{
		{[]gossip.State{mixed, prefill}, int(1000 * target), int(4000 * prefillTarget)},
		{[]gossip.State{mixed}, int(1000 * target), int(1000 * prefillTarget)},
		{[]gossip.State{prefill}, q.FallbackTokens, int(3000 * prefillTarget)}, // the mixed node left
		{nil, q.FallbackTokens, q.FallbackTokens},
	} {
		n.setPoolRates(step.states)
		want := map[admit.PoolCap]bool{{Model: "m", Pool: admit.PoolWhole, Tokens: step.whole}: true,
			{Model: "m", Pool: admit.PoolPrefill, Tokens: step.prefill}: true}
		got := caps()
		for c := range want {
			if !got[c] {
				t.Errorf("states %v: caps %v; want %v among them", step.states, got, c)
			}
		}
	}
}
