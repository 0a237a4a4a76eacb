package meshview

import (
	"cmp"
	"slices"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/node/engine"
)

// LoRA adapters in the node's record: the adapters its engine serves (engine.Model with a
// Parent) travel in State.Adapters, not State.Models, with whether each holds a GPU slot, and
// the engine's slots. A request naming an adapter is valid at any ingress that sees a node
// serving it (meshModelInfo), runs on such a node (PeerOf lists the adapter among the node's
// models), and GET /v1/models lists it with its parent (Mesh.Models).

// FillAdapters sets s's adapters from the engine's models and adapter state: those of a base
// model in s.Models, resident first, then by name, at most gossip.MaxAdapters; and the slots,
// free those the running batch's adapters leave.
func FillAdapters(s *gossip.State, models []engine.Model, lora engine.LoRAState, loaded []string) {
	for _, m := range models {
		if m.Parent == "" || !slices.ContainsFunc(s.Models, func(mi gossip.ModelInfo) bool { return mi.Name == m.Parent }) {
			continue
		}
		_, resident := slices.BinarySearch(lora.Resident, m.Name)
		resident = resident || slices.Contains(loaded, m.Name) // loaded on demand: on the GPU
		s.Adapters = append(s.Adapters, gossip.Adapter{Name: m.Name, Parent: m.Parent, Resident: resident})
	}
	slices.SortFunc(s.Adapters, func(a, b gossip.Adapter) int {
		if a.Resident != b.Resident {
			if a.Resident {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.Name, b.Name)
	})
	s.Adapters = s.Adapters[:min(len(s.Adapters), gossip.MaxAdapters)]
	s.LoRASlots = lora.MaxLoRAs
	if lora.MaxLoRAs > 0 {
		// A batch holds at most MaxLoRAs adapters: a slot is free for a new adapter unless a
		// running request's adapter holds it (an idle one is evicted for it), as vLLM's
		// scheduler skips a waiting request whose adapter would be one too many.
		s.LoRAFree = max(0, lora.MaxLoRAs-len(lora.Running))
	}
}

// AdapterOf returns the adapter name a node's record s lists as a model: its parent and the
// parent's context.
func AdapterOf(s *gossip.State, name string) (engine.Model, bool) {
	i := slices.IndexFunc(s.Adapters, func(a gossip.Adapter) bool { return a.Name == name })
	if i < 0 {
		return engine.Model{}, false
	}
	a := s.Adapters[i]
	for _, mi := range s.Models {
		if mi.Name == a.Parent {
			return engine.Model{Name: a.Name, ContextTokens: mi.ContextTokens, Parent: a.Parent}, true
		}
	}
	return engine.Model{}, false
}
