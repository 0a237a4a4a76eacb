package meshview

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/node/engine"
)

// TestFillAdapters pins the adapters a record lists: those of a served base model, resident
// first, then by name, at most gossip.MaxAdapters, with the engine's slots.
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
			FillAdapters(&s, tt.models, tt.lora, nil)
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
