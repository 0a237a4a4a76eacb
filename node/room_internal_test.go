package node

import (
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/gossip"
)

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
