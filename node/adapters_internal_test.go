package node

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/node/engine"
)

func TestFillAdapters(t *testing.T) {
	many := []engine.Model{{Name: "m"}}
	for i := range gossip.MaxAdapters + 4 {
		many = append(many, engine.Model{Name: fmt.Sprintf("a%02d", i), Parent: "m"})
	}
	tests := []struct {
		name      string
		models    []engine.Model
		lora      engine.LoRAState
		want      []gossip.Adapter
		slots, fr int
	}{
		{"none", []engine.Model{{Name: "m"}}, engine.LoRAState{}, nil, 0, 0},
		{"resident first, then by name; an adapter of a model not served is left out",
			[]engine.Model{{Name: "m"}, {Name: "b", Parent: "m"}, {Name: "z", Parent: "m"}, {Name: "x", Parent: "other"}},
			engine.LoRAState{MaxLoRAs: 4, Resident: []string{"z"}, Running: []string{"z"}},
			[]gossip.Adapter{{Name: "z", Parent: "m", Resident: true}, {Name: "b", Parent: "m"}}, 4, 3},
		{"bounded, resident kept", many, engine.LoRAState{MaxLoRAs: 2, Resident: []string{"a18", "a19"}, Running: []string{"a18", "a19"}}, nil, 2, 0},
		{"a slot of an idle adapter is free: the engine evicts it for a new one",
			[]engine.Model{{Name: "m"}, {Name: "b", Parent: "m"}, {Name: "z", Parent: "m"}},
			engine.LoRAState{MaxLoRAs: 2, Resident: []string{"b", "z"}, Running: []string{"z"}, Waiting: []string{"b"}},
			[]gossip.Adapter{{Name: "b", Parent: "m", Resident: true}, {Name: "z", Parent: "m", Resident: true}}, 2, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := gossip.State{Models: []gossip.ModelInfo{{Name: "m"}}}
			fillAdapters(&s, tt.models, tt.lora, nil)
			if s.LoRASlots != tt.slots || s.LoRAFree != tt.fr {
				t.Errorf("slots %d free %d, want %d and %d", s.LoRASlots, s.LoRAFree, tt.slots, tt.fr)
			}
			if tt.want != nil && !reflect.DeepEqual(s.Adapters, tt.want) {
				t.Errorf("adapters %+v, want %+v", s.Adapters, tt.want)
			}
			if tt.want == nil && len(tt.models) > gossip.MaxAdapters {
				if len(s.Adapters) != gossip.MaxAdapters || !s.Adapters[0].Resident || !s.Adapters[1].Resident {
					t.Errorf("adapters %+v: want %d, the resident a18 and a19 first", s.Adapters, gossip.MaxAdapters)
				}
			}
		})
	}
}

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
	p, oerr := n.prepare(engine.Chat, "r1", []byte(`{"model":"a","messages":[{"role":"user","content":"hello"}],"max_tokens":4}`))
	if oerr != nil {
		t.Fatal(oerr)
	}
	var tk ticket
	for i := range 3 {
		n.decide(time.Now(), p, &tk, nil, nil)
		if tk.D.Action != admit.Accept {
			t.Fatalf("decision %d: %+v, want an accept", i, tk.D)
		}
		n.planner.Release(&tk.Plan) // refused by its owner: back to the waiting room
	}
	if got := testutil.ToFloat64(n.m.adapterRouted.WithLabelValues("resident")) + testutil.ToFloat64(n.m.adapterRouted.WithLabelValues("free_slot")) +
		testutil.ToFloat64(n.m.adapterRouted.WithLabelValues("swap")); got != 1 {
		t.Errorf("kvmesh_route_adapter_requests_total = %v after three accepts of one request, want 1", got)
	}
}
