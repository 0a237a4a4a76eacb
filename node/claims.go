package node

import (
	"slices"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/node/meshview"
)

// publishClaims sets the claims this node publishes to those of heads (meshview.ClaimsOf),
// leaving the record unchanged when they are.
func (n *Node) publishClaims(heads map[*admit.Item]bool) {
	claims := meshview.ClaimsOf(heads)
	if old := n.claims.Load(); old != nil && slices.Equal(*old, claims) || old == nil && len(claims) == 0 {
		return
	}
	n.claims.Store(&claims)
}

// claimedHere is the KV room claimed on this node for requests that outrank r, a request
// ingress forwarded (meshview.Mesh.ClaimedHere).
func (n *Node) claimedHere(r meshview.Rank, ingress string) int {
	var own []gossip.Claim
	if c := n.claims.Load(); c != nil {
		own = *c
	}
	return n.mesh.ClaimedHere(r, ingress, own)
}
