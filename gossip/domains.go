package gossip

import (
	"slices"
)

// domain is one model's prefix domain as this node sees it: the alive peers serving the model.
type domain struct {
	members []string // this node excluded, sorted
}

// rebuildDomainsLocked rebuilds byModel and this node's domains after a liveness or a model
// list changed, and forgets the residency of peers that share no model with this node: it is
// kept only for peers whose prefixes a request here could use.
func (g *Gossip) rebuildDomainsLocked() {
	if !g.domainsDirty {
		return
	}
	g.domainsDirty = false
	for m, names := range g.byModel {
		g.byModel[m] = names[:0]
	}
	for name, p := range g.peers {
		if name == g.cfg.Name || p.liveness != LivenessAlive || !p.hasState {
			continue
		}
		for _, mi := range p.state.Models {
			if names := g.byModel[mi.Name]; !slices.Contains(names, name) {
				g.byModel[mi.Name] = append(names, name)
			}
		}
		for _, a := range p.state.Adapters { // a node serving an adapter serves its requests
			if names := g.byModel[a.Name]; !slices.Contains(names, name) {
				g.byModel[a.Name] = append(names, name)
			}
		}
	}
	for m, names := range g.byModel {
		if len(names) == 0 {
			delete(g.byModel, m)
			continue
		}
		slices.Sort(names)
	}
	for m := range g.domains {
		if !slices.ContainsFunc(g.pub.Models, func(mi ModelInfo) bool { return mi.Name == m }) {
			delete(g.domains, m) // no longer served: its queued messages have no one to go to
		}
	}
	for _, mi := range g.pub.Models {
		d := g.domains[mi.Name]
		if d == nil {
			d = &domain{}
			g.domains[mi.Name] = d
		}
		d.members = g.byModel[mi.Name]
	}
	inDomain := 0
	for name, p := range g.peers {
		if name == g.cfg.Name || !p.hasState {
			continue
		}
		if g.otherModelLocked(p) {
			// Each side drops the other's residency: back in a domain, both resend theirs.
			g.idx.DropPeer(name)
			p.maxDelta, p.seen, p.synced = 0, 0, 0
		} else if p.liveness == LivenessAlive {
			inDomain++
		}
	}
	g.inDomain = inDomain
	g.refreshStaleLocked()
	g.met.domainPeers.Set(float64(inDomain))
}

// otherModelLocked reports whether p is outside every prefix domain of this node: both
// records list models and they share none. Until both are known the peer counts as inside.
func (g *Gossip) otherModelLocked(p *peerInfo) bool {
	if !p.hasState || len(p.state.Models) == 0 || len(g.pub.Models) == 0 {
		return false
	}
	for _, mi := range p.state.Models {
		if g.domains[mi.Name] != nil {
			return false
		}
	}
	return true
}

// domainMembersLocked lists the members of each of this node's domains.
func (g *Gossip) domainMembersLocked() [][]string {
	out := make([][]string, 0, len(g.domains))
	for _, d := range g.domains {
		out = append(out, d.members)
	}
	return out
}
