package node

import (
	"cmp"
	"slices"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/gossip"
)

// KV claims (docs/design/admission.md, "The waiting room"): a pool's head that must wait for
// KV room claims its need on the candidate where it fits first (admit.Admitter.ClaimFor). This
// node's own backfill keeps off that room (admit.Claim.Take); the claim also goes out in this
// node's record, and every other node counts it as used on that peer, in its routing view and,
// on the peer itself, in the owner's check of what other ingresses forward. Without that, a
// request needing a large share of an engine's KV waited while the other ingresses' smaller
// requests took every block freed, until its deadline passed.

// publishClaims sets the claims this node publishes to those of heads (the blocked heads of the
// last room pass): at most gossip.MaxClaims, the earliest deadlines first, in a stable order so
// that an unchanged set leaves the record unchanged.
func (n *Node) publishClaims(heads map[*admit.Item]bool) {
	var its []*admit.Item
	for it := range heads {
		if it.Claim.Publish && it.Claim.Blocks > 0 {
			its = append(its, it)
		}
	}
	slices.SortFunc(its, func(a, b *admit.Item) int {
		return cmp.Or(a.Deadline.Compare(b.Deadline), cmp.Compare(a.ID, b.ID))
	})
	claims := make([]gossip.Claim, 0, min(len(its), gossip.MaxClaims))
	for _, it := range its[:min(len(its), gossip.MaxClaims)] {
		claims = append(claims, gossip.Claim{Peer: it.Claim.Peer, Blocks: it.Claim.Blocks})
	}
	slices.SortFunc(claims, func(a, b gossip.Claim) int {
		return cmp.Or(cmp.Compare(a.Peer, b.Peer), cmp.Compare(a.Blocks, b.Blocks))
	})
	if old := n.claims.Load(); old != nil && slices.Equal(*old, claims) || old == nil && len(claims) == 0 {
		return
	}
	n.claims.Store(&claims)
}

// claimedHere is the KV room claimed on this node by every waiting-room head but those of
// ingress, the node a forwarded request came from: the other nodes' claims by their records,
// and this node's own.
func (n *Node) claimedHere(ingress string) int {
	total := 0
	if n.g != nil {
		total = n.g.Claimed(n.cfg.Name, ingress)
	}
	if c := n.claims.Load(); c != nil && ingress != n.cfg.Name {
		for _, cl := range *c {
			if cl.Peer == n.cfg.Name {
				total += cl.Blocks
			}
		}
	}
	return total
}
