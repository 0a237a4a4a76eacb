package meshview

import (
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/admit/plan"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/kvindex"
)

// View is one routing decision's picture of the mesh: the planner's view (this node first,
// with its exact state, then the peers as gossiped) and where to reach each peer. Its slices
// are scratch, reused by the next decision.
type View struct {
	plan.View
	QUIC    []string // QUIC address per peer ("" for this node)
	matches []kvindex.Match
	members []gossip.Member // scratch for gossip.MembersServing
	claimed map[string]int  // scratch for gossip.ClaimedAhead
}

// Exclude marks the peers named in names ejected, for this view's request alone: the owners
// that failed it mid-response.
func (v *View) Exclude(names []string) {
	for i := range v.Peers {
		if slices.Contains(names, v.Peers[i].Name) {
			v.Peers[i].Ejected = true
		}
	}
}

// AddMember appends m, reached at quic; dirty is the carbon rule's mark of its record, ejected marks
// a peer this node's forwards cannot reach lately (route.Ejector).
func (v *View) AddMember(m *gossip.Member, quic string, dirty, ejected bool) {
	p := PeerOf(m)
	p.Ejected = ejected
	v.View.Add(p, dirty)
	v.QUIC = append(v.QUIC, quic)
}

// Mesh is what a node's views are built from beyond its own record: gossip's members and
// routing's parts. Its fields are set once, when the node is built.
type Mesh struct {
	Self   string         // this node's name
	Gossip *gossip.Gossip // nil: a standalone node, which sees itself alone
	Policy route.Policy   // observes each record a view reads (route.Policy.Observe)
	Eject  *route.Ejector // the peers this node's forwards cannot reach lately
	// Dirty is the carbon rule's mark of a record (plan.View.Add); nil: none is dirty.
	Dirty func(gossip.State) bool
}

// dirty is m.Dirty's mark of s.
func (m Mesh) dirty(s gossip.State) bool { return m.Dirty != nil && m.Dirty(s) }

// AddPeers adds to v, after this node, the members serving model that are candidates or
// stale, each observed by the policy as of its record's time; counts as used the KV room
// other ingresses' blocked heads claim for requests that outrank r; and sets each peer's
// prefix blocks from the longest match of blocks. The view holds the model's peers only
// (gossip's index by model), so a decision costs the model's peers, not the mesh's.
func (m Mesh) AddPeers(v *View, model string, blocks []uint64, r Rank, now time.Time) {
	if m.Gossip == nil {
		return
	}
	v.members = m.Gossip.MembersServing(v.members[:0], model)
	for i := range v.members {
		mb := &v.members[i]
		if !mb.Candidate && !mb.Stale {
			continue
		}
		m.Policy.Observe(mb.Name, mb.Updated)
		v.AddMember(mb, mb.State.QUICAddr, m.dirty(mb.State), m.Eject.Ejected(now, mb.Name))
	}
	clear(v.members) // drop the records' references until the next decision
	if v.claimed == nil {
		v.claimed = make(map[string]int)
	}
	clear(v.claimed)
	m.Gossip.ClaimedAhead(v.claimed, r.Priority, r.Arrived, "")
	for i := range v.Peers {
		v.Peers[i].KVBlocksUsed += v.claimed[v.Peers[i].Name]
	}
	v.matches = m.Gossip.LongestPrefix(blocks, v.matches[:0])
	for _, mt := range v.matches {
		for i := range v.Peers {
			if v.Peers[i].Name == mt.Peer {
				v.Peers[i].PrefixBlocks = mt.Blocks
			}
		}
	}
}

// SelfPrefix is the longest prefix of blocks gossip's index lists for this node (0 without
// gossip).
func (m Mesh) SelfPrefix(blocks []uint64) int {
	if m.Gossip == nil {
		return 0
	}
	n := 0
	for _, mt := range m.Gossip.LongestPrefix(blocks, nil) {
		if mt.Peer == m.Self {
			n = mt.Blocks
		}
	}
	return n
}
