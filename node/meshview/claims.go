package meshview

import (
	"cmp"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/gossip"
)

// KV claims (docs/design/admission.md, "The waiting room"): a pool's head that must wait for
// KV room claims its need on the candidate where it fits first (admit.Admitter.ClaimFor). This
// node's own backfill keeps off that room (admit.Claim.Take); a claim past the hysteresis gap
// (admit.Claim.Publish) also goes out in this node's record with the head's priority and
// arrival, and every node counts it as used on that peer for the requests it outranks
// (gossip.Claim.Outranks): in its routing view and, on the peer itself, in the owner's check
// of what ingresses forward. Without that, a request needing a large share of an engine's KV
// waited while the other ingresses' smaller requests took every block freed, until its
// deadline passed; ranked by arrival, of two heads claiming one peer the later waits for the
// earlier, not both for room for two.

// Rank is a request's standing against claims: its priority and arrival.
type Rank struct {
	Priority int
	Arrived  time.Time
}

// ClaimsOf returns the claims a node publishes for heads (the blocked heads of its last room
// pass): at most gossip.MaxClaims, the highest ranks first, in a stable order so that an
// unchanged set gives an equal slice. A head whose claim is left out keeps it local: ClaimsOf
// clears its Claim.Publish (no admission mark either: admit.Admitter.Ready).
func ClaimsOf(heads map[*admit.Item]bool) []gossip.Claim {
	var its []*admit.Item
	for it := range heads {
		if it.Claim.Publish && it.Claim.Blocks > 0 {
			its = append(its, it)
		}
	}
	slices.SortFunc(its, func(a, b *admit.Item) int {
		return cmp.Or(cmp.Compare(b.Priority, a.Priority), a.Arrived.Compare(b.Arrived), cmp.Compare(a.ID, b.ID))
	})
	for _, it := range its[min(len(its), gossip.MaxClaims):] {
		it.Claim.Publish = false
	}
	claims := make([]gossip.Claim, 0, min(len(its), gossip.MaxClaims))
	for _, it := range its[:min(len(its), gossip.MaxClaims)] {
		claims = append(claims, gossip.Claim{Peer: it.Claim.Peer, Blocks: min(it.Claim.Blocks, gossip.MaxClaimBlocks),
			Priority: it.Priority, Arrived: it.Arrived.Truncate(time.Millisecond)})
	}
	slices.SortFunc(claims, func(a, b gossip.Claim) int {
		return cmp.Or(cmp.Compare(a.Peer, b.Peer), a.Arrived.Compare(b.Arrived), cmp.Compare(b.Priority, a.Priority),
			cmp.Compare(a.Blocks, b.Blocks))
	})
	return claims
}

// ClaimedHere is the KV room claimed on this node for requests that outrank r, a request
// ingress forwarded: by the other nodes' records (ingress's own left out: the request may be
// the head that claimed, which must not wait for its own room) and by own, this node's own
// claims.
func (m Mesh) ClaimedHere(r Rank, ingress string, own []gossip.Claim) int {
	total := 0
	if m.Gossip != nil {
		by := map[string]int{}
		m.Gossip.ClaimedAhead(by, r.Priority, r.Arrived, ingress)
		total = by[m.Self]
	}
	for _, cl := range own {
		if cl.Peer == m.Self && cl.Outranks(r.Priority, r.Arrived) {
			total += cl.Blocks
		}
	}
	return total
}
