package gossip

import (
	"sort"
	"time"

	"github.com/hashicorp/memberlist"
)

// Liveness is a member's failure-detector state.
type Liveness string

// Liveness values, as memberlist's SWIM reports them. memberlist v0.7.0 reports joins and
// deaths to its event delegate but not the transient suspect state, so a suspected member
// shows as alive until it is declared dead; LivenessSuspect is part of the vocabulary (the
// /v1/mesh/peers JSON) for when that signal is available.
const (
	LivenessAlive   Liveness = "alive"
	LivenessSuspect Liveness = "suspect"
	LivenessDead    Liveness = "dead"
	LivenessLeft    Liveness = "left"
)

// Member is one node in this node's view of the mesh.
type Member struct {
	Name string
	// Addr is the member's gossip address (host:port).
	Addr     string
	Liveness Liveness
	// State is the member's last state record (zero if none arrived yet).
	State State
	// Updated is when this node received that record; Age is now minus Updated.
	Updated time.Time
	Age     time.Duration
	// Stale: no record for longer than MaxAge (or none at all). MaxAge is StaleAfter, or three
	// mesh intervals for a member outside this node's domains in a mesh large enough that their
	// records come only that often (Config.MeshPublishInterval).
	Stale  bool
	MaxAge time.Duration
	// Candidate: alive with a record, and fresh or stale under FailOpen; the router may send it work.
	Candidate bool
	// PrefixBlocks is how many of the member's prefix blocks this node's index holds.
	PrefixBlocks int
	// Incarnation counts the boots (distinct BootIDs) of the member this node has seen,
	// from 1; a restart increments it. memberlist's internal SWIM incarnation is not exported.
	Incarnation uint32
	Self        bool
}

// refreshStaleLocked sets the record ages past which a peer is stale: StaleAfter, or three
// times the interval records come at once they are spread thinner than PublishInterval: for a
// member of this node's domains the shorter of the direct and the mesh-wide intervals (this
// node's own pace stands in for the peer's: a peer in more or larger domains sends less often
// than that; a record could carry its pace), for one outside them the mesh-wide one.
func (g *Gossip) refreshStaleLocked() {
	g.staleIn, g.staleOut = g.cfg.StaleAfter, g.cfg.StaleAfter
	if !g.directRecordsLocked() {
		return
	}
	mesh := g.meshIntervalLocked()
	g.staleIn = max(g.cfg.StaleAfter, 3*min(mesh, g.directEveryLocked()))
	g.staleOut = max(g.cfg.StaleAfter, 3*mesh)
}

// staleAfterLocked is the record age past which p is stale (refreshStaleLocked). A peer whose
// models are not known yet counts as inside; with no models of its own, this node is in no
// domain and gets every record through the mesh.
func (g *Gossip) staleAfterLocked(p *peerInfo) time.Duration {
	if len(g.pub.Models) > 0 && !g.otherModelLocked(p) {
		return g.staleIn
	}
	return g.staleOut
}

func (g *Gossip) markStaleLocked(now time.Time) {
	g.refreshStaleLocked()
	stale := 0
	for name, p := range g.peers {
		if name == g.cfg.Name {
			continue
		}
		if p.liveness == LivenessDead || p.liveness == LivenessLeft {
			if now.Sub(p.changed) > g.cfg.DeadRetention {
				delete(g.peers, name)
			}
			continue
		}
		if !p.hasState || now.Sub(p.updated) > g.staleAfterLocked(p) {
			stale++
		}
	}
	g.met.stale.Set(float64(stale))
}

// Members returns this node's view of the mesh, itself included, sorted by name.
func (g *Gossip) Members() []Member {
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]Member, 0, len(g.peers)+1)
	self := Member{
		Name: g.cfg.Name, Liveness: LivenessAlive, State: g.pub, Updated: g.pubAt,
		Age: now.Sub(g.pubAt), Candidate: true, Incarnation: 1, Self: true,
	}
	if p := g.peers[g.cfg.Name]; p != nil {
		self.Addr, self.Liveness = p.addr, p.liveness
	}
	self.PrefixBlocks = g.idx.PeerBlocks(g.cfg.Name)
	out = append(out, self)
	for name, p := range g.peers {
		if name != g.cfg.Name {
			out = append(out, g.memberLocked(name, p, now))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func (g *Gossip) memberLocked(name string, p *peerInfo, now time.Time) Member {
	m := Member{
		Name: name, Addr: p.addr, Liveness: p.liveness, State: p.state, Updated: p.updated,
		Incarnation: p.incarnation, PrefixBlocks: g.idx.PeerBlocks(name),
	}
	if p.hasState {
		m.Age = now.Sub(p.updated)
	}
	m.MaxAge = g.staleAfterLocked(p)
	m.Stale = !p.hasState || m.Age > m.MaxAge
	m.Candidate = p.liveness == LivenessAlive && p.hasState && (!m.Stale || g.cfg.StalePolicy == FailOpen)
	return m
}

// MembersServing appends to dst the alive members other than this node whose last record
// lists model among its models or its adapters, sorted by name, as Members would describe
// them. It reads an index by model kept as liveness and records' model lists change, so its
// cost is the model's members, not the mesh's: what a routing decision needs.
func (g *Gossip) MembersServing(dst []Member, model string) []Member {
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.rebuildDomainsLocked()
	for _, name := range g.byModel[model] {
		dst = append(dst, g.memberLocked(name, g.peers[name], now))
	}
	return dst
}

func (g *Gossip) memberEvent(n *memberlist.Node, live Liveness) {
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.peers[n.Name]
	if p == nil {
		p = &peerInfo{}
		g.peers[n.Name] = p
	}
	p.addr = n.Address()
	if live != "" && live != p.liveness {
		if live == LivenessAlive {
			// Back from dead or new: each side dropped the other's residency, so accept the
			// next snapshot and send this node's.
			p.maxDelta, p.seen, p.synced = 0, 0, 0
		} else if n.Name != g.cfg.Name {
			g.idx.DropPeer(n.Name)
		}
		p.liveness, p.changed = live, time.Now()
		g.domainsDirty, g.claimsDirty = true, true
	}
	counts := map[Liveness]int{}
	for _, q := range g.peers {
		counts[q.liveness]++
	}
	g.alive.Store(int32(counts[LivenessAlive]))
	g.setJoinGauge() // a peer that joined this node ends a failing join
	for _, l := range []Liveness{LivenessAlive, LivenessSuspect, LivenessDead, LivenessLeft} {
		g.met.members.WithLabelValues(string(l)).Set(float64(counts[l]))
	}
}

// MessagesNative reports whether the member named name last said its engine serves the
// Anthropic Messages API natively (State.MessagesNative); false for a name it does not know.
func (g *Gossip) MessagesNative(name string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.peers[name]
	return p != nil && p.state.MessagesNative
}
