package node

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/journey"
)

// TestAdapterRoutedCountedOnce pins that kvmesh_route_adapter_requests_total counts a request
// once: a request its owners refuse goes back to the waiting room, whose accept decides it
// again (decide) without counting it again.
func TestAdapterRoutedCountedOnce(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Name, cfg.Standalone, cfg.GPU = "once", true, "none"
	cfg.Sim.LoRAModules = map[string]string{"a": "/lora/a"}
	n, err := New(cfg) // New binds nothing and starts no goroutine
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Shutdown(t.Context()) })
	p, oerr := n.api.Prepare(engine.Chat, "r1", []byte(`{"model":"a","messages":[{"role":"user","content":"hello"}],"max_tokens":4}`))
	if oerr != nil {
		t.Fatal(oerr)
	}
	var tk journey.Ticket
	for i := range 3 {
		n.x.Decide(time.Now(), p, &tk, nil, nil)
		if tk.D.Action != admit.Accept {
			t.Fatalf("decision %d: %+v, want an accept", i, tk.D)
		}
		n.planner.Release(&tk.Plan) // refused by its owner: back to the waiting room
	}
	if got := testutil.ToFloat64(n.m.AdapterRouted.WithLabelValues("resident")) + testutil.ToFloat64(n.m.AdapterRouted.WithLabelValues("free_slot")) +
		testutil.ToFloat64(n.m.AdapterRouted.WithLabelValues("swap")); got != 1 {
		t.Errorf("kvmesh_route_adapter_requests_total = %v after three accepts of one request, want 1", got)
	}
}
