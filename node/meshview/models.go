package meshview

import (
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/node/engine"
)

// Served returns model as some live peer's record lists it: a model, or an adapter with its
// parent and the parent's context.
func (m Mesh) Served(model string) (engine.Model, bool) {
	if m.Gossip == nil {
		return engine.Model{}, false
	}
	for _, mb := range m.Gossip.Members() {
		if mb.Liveness != gossip.LivenessAlive {
			continue
		}
		for _, mi := range mb.State.Models {
			if mi.Name == model {
				return engine.Model{Name: model, ContextTokens: mi.ContextTokens}, true
			}
		}
		if a, ok := AdapterOf(&mb.State, model); ok {
			return a, true
		}
	}
	return engine.Model{}, false
}

// Models lists the models served anywhere in the mesh: local (this node's engine's) first,
// then those live peers' records list, adapters with their parents.
func (m Mesh) Models(local []engine.Model) []engine.Model {
	seen := map[string]bool{}
	var out []engine.Model
	for _, em := range local {
		seen[em.Name] = true
		out = append(out, em)
	}
	if m.Gossip == nil {
		return out
	}
	for _, mb := range m.Gossip.Members() {
		if mb.Liveness != gossip.LivenessAlive {
			continue
		}
		for _, mi := range mb.State.Models {
			if !seen[mi.Name] {
				seen[mi.Name] = true
				out = append(out, engine.Model{Name: mi.Name, ContextTokens: mi.ContextTokens})
			}
		}
		for _, a := range mb.State.Adapters {
			if am, ok := AdapterOf(&mb.State, a.Name); ok && !seen[a.Name] {
				seen[a.Name] = true
				out = append(out, am)
			}
		}
	}
	return out
}

// BytesPerToken is the mean prompt bytes per token each model's other live nodes publish
// (gossip.ModelInfo.BytesPerToken), by model; nil without gossip.
func (m Mesh) BytesPerToken() map[string]float64 {
	if m.Gossip == nil {
		return nil
	}
	sum, k := map[string]float64{}, map[string]int{}
	for _, mb := range m.Gossip.Members() {
		if mb.Self || mb.Liveness != gossip.LivenessAlive {
			continue
		}
		for _, mi := range mb.State.Models {
			if mi.BytesPerToken > 0 {
				sum[mi.Name] += mi.BytesPerToken
				k[mi.Name]++
			}
		}
	}
	mean := make(map[string]float64, len(sum))
	for model, s := range sum {
		mean[model] = s / float64(k[model])
	}
	return mean
}

// AgentsAdvertised returns, by route.AgentKey, the healthy peers that advertise being home
// to an agent (gossip State.AgentKeys): the peers routing would send an agent's steps to. Nil
// when none does, or without gossip.
func (m Mesh) AgentsAdvertised() map[uint64][]string {
	if m.Gossip == nil {
		return nil
	}
	var out map[uint64][]string
	for _, mb := range m.Gossip.Members() {
		if mb.Self || mb.Liveness != gossip.LivenessAlive || !mb.Candidate && !mb.Stale || !mb.State.EngineHealthy {
			continue
		}
		for _, k := range mb.State.AgentKeys {
			if out == nil {
				out = map[uint64][]string{}
			}
			out[k] = append(out[k], mb.Name)
		}
	}
	return out
}
