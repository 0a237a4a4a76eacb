package node_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/carbon"
	"github.com/kvmesh/kvmesh/carbon/provider"
	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/node"
)

// carbonNet starts one node per intensity, each on its own grid zone, all with threshold 300.
func carbonNet(t *testing.T, intensities ...float64) []string {
	t.Helper()
	tn := startNet(t, len(intensities), func(i int, cfg *node.Config) {
		tc := carbon.DefaultConfig()
		tc.Threshold = 300
		cfg.Carbon = &node.CarbonConfig{
			Provider: provider.Config{Kind: provider.KindStatic, Zone: []string{"clean-zone", "dirty-zone", "zone-3"}[i], StaticIntensity: intensities[i]},
			Tracker:  tc,
		}
	})
	urls := tn.URLs()
	// Every node must see every grid's reading before the rule can route on it.
	for _, u := range urls {
		poll.Until(t, 5*time.Second, "carbon readings in the state records", func() bool {
			seen := 0
			for _, p := range peers(t, u).Peers {
				if p.CarbonZone != "" && !p.CarbonStale {
					seen++
				}
			}
			return seen == len(urls)
		})
	}
	return urls
}

func TestSheddableRequestsRunOnTheCleanGrid(t *testing.T) {
	urls := carbonNet(t, 100, 500) // n1 clean, n2 dirty
	for i := range 5 {
		resp := post(t, urls[1], "/v1/chat/completions", chatBody("batch job", 3, false), map[string]string{node.HeaderPriority: "low"})
		b := readAll(t, resp)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(node.HeaderNode) != "n1" {
			t.Fatalf("low priority #%d on the dirty node: status %d ran on %q: %s", i, resp.StatusCode, resp.Header.Get(node.HeaderNode), b)
		}
	}
	// Normal priority is never affected: the dirty node still runs what routing gives it.
	ran := map[string]int{}
	for range 8 {
		resp := post(t, urls[1], "/v1/chat/completions", chatBody("interactive", 3, false), nil)
		if readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("normal priority: status %d", resp.StatusCode)
		}
		ran[resp.Header.Get(node.HeaderNode)]++
	}
	if ran["n2"] == 0 {
		t.Errorf("normal traffic never ran on the dirty node: %v", ran)
	}
	if got := metric(t, urls[1], "kvmesh_carbon_rerouted_total", ""); got < 5 {
		t.Errorf("kvmesh_carbon_rerouted_total %v, want ≥ 5", got)
	}
}

func TestSheddableRequestsAreDeferredWhenEveryGridIsDirty(t *testing.T) {
	urls := carbonNet(t, 450, 500)
	resp := post(t, urls[0], "/v1/chat/completions", chatBody("batch job", 3, false), map[string]string{node.HeaderPriority: "-1"})
	b := readAll(t, resp)
	if resp.StatusCode != http.StatusTooManyRequests || decodeError(t, b).Error.Code != node.CodeCarbonDeferred || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("status %d Retry-After %q: %s", resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
	resp = post(t, urls[0], "/v1/chat/completions", chatBody("interactive", 3, false), map[string]string{node.HeaderPriority: "high"})
	if readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("high priority on dirty grids: status %d", resp.StatusCode)
	}
	if got := metric(t, urls[0], "kvmesh_carbon_fail_mode_active", `mode="open"`); got != 0 {
		t.Errorf("fail mode reported active with fresh readings: %v", got)
	}
}
