package node

import (
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/gossip"
)

// roomSecond updates, once a second from the room loop, what the waiting room reads from the
// mesh: the pools' prefill rates, the API keys' usage elsewhere, the peers' bytes per token.
func (n *Node) roomSecond(now time.Time) {
	n.updatePrefillRates()
	n.updateKeyUsage(now)
	n.updateMeshTokens()
}

// updateKeyUsage tells the API keys what each consumed through the other nodes, from their
// latest state records, so that a key's rate holds across the mesh (admit/usage.go).
func (n *Node) updateKeyUsage(now time.Time) {
	if n.g == nil || n.adm.Keys().Len() == 0 {
		return
	}
	remote := map[uint64]float64{}
	for _, m := range n.g.Members() {
		if m.Self || m.Liveness != gossip.LivenessAlive {
			continue
		}
		for _, u := range m.State.KeyUsage {
			remote[u.ID] += u.TokensPerSecond
		}
	}
	n.adm.Keys().SetRemote(now, remote)
}

// updatePrefillRates tells the waiting room each model's prefill throughput across the mesh
// (poolRates), from which it derives its token caps (target TTFT × rate).
func (n *Node) updatePrefillRates() {
	var states []gossip.State
	if n.g == nil {
		states = append(states, n.localState())
	} else {
		for _, m := range n.g.Members() {
			if m.Candidate {
				states = append(states, m.State)
			}
		}
	}
	n.setPoolRates(states)
}

// setPoolRates sets the waiting room's pool rates from the nodes' states (poolRates).
func (n *Node) setPoolRates(states []gossip.State) {
	cfg := n.planner.Policy().Config()
	rates := poolRates(states, cfg.LocalPrefill(), cfg.Roles)
	for k, r := range rates {
		n.adm.Room().SetPrefillRate(k.model, k.role, r)
	}
	// A pool no node serves any more (its nodes left, or stopped running its requests) falls
	// back to queue.fallback_tokens rather than keep the rate it last had.
	for k := range n.ratedPools {
		if _, ok := rates[k]; !ok {
			n.adm.Room().SetPrefillRate(k.model, k.role, 0)
		}
	}
	n.ratedPools = rates
}

// poolKey names a waiting room pool: a model, and the role of its requests ("" whole,
// admit.RolePrefill split).
type poolKey struct{ model, role string }

// poolRates sums the prefill rates of the nodes in states by the pools whose requests they can
// take. The whole requests' pool counts the mixed nodes and the decode nodes that run requests
// whole (local: route.decode_local_prefill on this node, and the node does not advertise
// HalvesOnly); the split requests' pool the nodes that run a prefill half and those same
// decode nodes, to which a split request falls back when the prefill nodes are behind. Leaving
// those decode nodes out held a mesh of prefill and decode nodes to the fallback cap, far under
// what it prefills. roles is route.roles: when set, only nodes of those roles run whole
// requests.
func poolRates(states []gossip.State, local bool, roles []string) map[poolKey]float64 {
	rates := map[poolKey]float64{}
	for _, s := range states {
		whole := !route.IsHalf(s.Role) || (local && s.Role == route.RoleDecode && !s.HalvesOnly)
		whole = whole && route.RolesAllow(roles, s.Role)
		for _, m := range s.Models {
			if s.Role != route.RoleDecode || whole {
				rates[poolKey{m.Name, admit.RolePrefill}] += s.PrefillTokensPerSecond
			}
			if whole {
				rates[poolKey{m.Name, ""}] += s.PrefillTokensPerSecond
			}
		}
	}
	return rates
}
