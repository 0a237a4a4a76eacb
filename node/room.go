package node

import (
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/node/meshview"
)

// roomSecond updates, once a second from the room loop, what the waiting room reads from the
// mesh: the pools' prefill rates, the API keys' usage elsewhere, the peers' bytes per token.
func (n *Node) roomSecond(now time.Time) {
	n.updatePrefillRates()
	n.updateKeyUsage(now)
	n.tokens.Refresh(n.mesh)
}

// updateKeyUsage tells the API keys what each consumed through the other nodes, from their
// latest state records, so that a key's rate holds across the mesh (admit/usage.go).
func (n *Node) updateKeyUsage(now time.Time) {
	if n.g == nil || n.adm.Keys().Len() == 0 {
		return
	}
	n.adm.Keys().SetRemote(now, n.mesh.KeyUsage())
}

// updatePrefillRates tells the waiting room each model's prefill throughput across the mesh
// (meshview.PoolRates), from which it derives its token caps (target TTFT × rate).
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

// setPoolRates sets the waiting room's pool rates from the nodes' states (meshview.PoolRates).
func (n *Node) setPoolRates(states []gossip.State) {
	cfg := n.planner.Policy().Config()
	rates := meshview.PoolRates(states, cfg.LocalPrefill(), cfg.Roles)
	for k, r := range rates {
		n.adm.Room().SetPrefillRate(k.Model, k.Role, r)
	}
	// A pool no node serves any more (its nodes left, or stopped running its requests) falls
	// back to queue.fallback_tokens rather than keep the rate it last had.
	for k := range n.ratedPools {
		if _, ok := rates[k]; !ok {
			n.adm.Room().SetPrefillRate(k.Model, k.Role, 0)
		}
	}
	n.ratedPools = rates
}
