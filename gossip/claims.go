package gossip

import (
	"time"
)

// heldClaim is a claim and the member whose record holds it.
type heldClaim struct {
	by string
	Claim
}

// ClaimedAhead adds to dst, by peer name, the KV blocks the other members' latest records
// claim for requests that outrank one of priority that arrived at arrived (Claim.Outranks):
// the room such a request must leave alone. The claims of except (the ingress a request came
// from, whose own claim must not stand in its way, "" for none) are left out. Only alive
// members with a fresh record count. One lock and a walk of the mesh's claims, a handful.
func (g *Gossip) ClaimedAhead(dst map[string]int, priority int, arrived time.Time, except string) {
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.freshClaimsLocked(now)
	for _, c := range g.claims {
		if c.by != except && c.Outranks(priority, arrived) {
			dst[c.Peer] = min(dst[c.Peer]+c.Blocks, MaxClaimBlocks)
		}
	}
}

// freshClaimsLocked rebuilds the claims index if a record's claims or a liveness changed since,
// or a PublishInterval passed. A claim counts while its record is at most StaleAfter old,
// however long the peer itself stays fresh: a claim holds room for a head blocked now, which
// its claimant republishes every pass, and a record that comes slower than that (from outside
// this node's domains in a large mesh, every mesh interval) would hold the room for seconds
// or minutes after the head left.
func (g *Gossip) freshClaimsLocked(now time.Time) {
	if !g.claimsDirty && now.Sub(g.claimsBuilt) < g.cfg.PublishInterval {
		return
	}
	g.claims = g.claims[:0]
	for name, p := range g.peers {
		if len(p.state.Claims) == 0 || name == g.cfg.Name || p.liveness != LivenessAlive || !p.hasState ||
			now.Sub(p.updated) > g.cfg.StaleAfter {
			continue
		}
		for _, c := range p.state.Claims {
			g.claims = append(g.claims, heldClaim{by: name, Claim: c})
		}
	}
	g.claimsDirty, g.claimsBuilt = false, now
}
