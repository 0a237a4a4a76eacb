package meshview

import (
	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/gossip"
)

// PoolKey names a waiting room pool: a model, and the role of its requests ("" whole,
// admit.RolePrefill split).
type PoolKey struct{ Model, Role string }

// PoolRates sums the prefill rates of the nodes in states by the pools whose requests they can
// take. The whole requests' pool counts the mixed nodes and the decode nodes that run requests
// whole (local: route.decode_local_prefill on this node, and the node does not advertise
// HalvesOnly); the split requests' pool the nodes that run a prefill half and those same
// decode nodes, to which a split request falls back when the prefill nodes are behind. Leaving
// those decode nodes out held a mesh of prefill and decode nodes to the fallback cap, far under
// what it prefills. roles is route.roles: when set, only nodes of those roles run whole
// requests.
func PoolRates(states []gossip.State, local bool, roles []string) map[PoolKey]float64 {
	rates := map[PoolKey]float64{}
	for _, s := range states {
		whole := !route.IsHalf(s.Role) || (local && s.Role == route.RoleDecode && !s.HalvesOnly)
		whole = whole && route.RolesAllow(roles, s.Role)
		for _, m := range s.Models {
			if s.Role != route.RoleDecode || whole {
				rates[PoolKey{m.Name, admit.RolePrefill}] += s.PrefillTokensPerSecond
			}
			if whole {
				rates[PoolKey{m.Name, ""}] += s.PrefillTokensPerSecond
			}
		}
	}
	return rates
}

// KeyUsage is what each API key consumed through the other live nodes, in tokens per second,
// from their latest records; nil without gossip.
func (m Mesh) KeyUsage() map[uint64]float64 {
	if m.Gossip == nil {
		return nil
	}
	remote := map[uint64]float64{}
	for _, mb := range m.Gossip.Members() {
		if mb.Self || mb.Liveness != gossip.LivenessAlive {
			continue
		}
		for _, u := range mb.State.KeyUsage {
			remote[u.ID] += u.TokensPerSecond
		}
	}
	return remote
}
