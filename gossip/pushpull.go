package gossip

import (
	"math"
	"time"

	"github.com/kvmesh/kvmesh/kvindex"
)

// The push/pull exchange memberlist runs with a random member every PushPullInterval, and at
// a join: each side sends its record and its whole residency.

// localState is the push/pull payload: this node's record and its full residency.
func (g *Gossip) localState() []byte {
	g.mu.Lock()
	fn, st, seq := g.snapshotFn, g.pub, g.deltaSeq
	g.mu.Unlock()
	blocks := g.residency(fn)
	rec, err := EncodeState(st)
	if err != nil {
		return nil
	}
	b, err := appendPushPull([]byte{wireVersion, msgPushPull}, rec, kvindex.Summary{Snapshot: true, Seq: seq, Added: blocks})
	if err != nil {
		return nil
	}
	return b
}

// mergeRemoteState is a push/pull payload from a peer: its record, and its residency, which
// replaces the index's view of it unless deltas newer than the snapshot were applied already.
func (g *Gossip) mergeRemoteState(b []byte) {
	kind, ok := g.envelope(b)
	if !ok {
		return
	}
	if kind != msgPushPull {
		g.drop(dropType)
		return
	}
	st, s, err := decodePushPull(b[2:])
	if err != nil {
		g.drop(reasonOf(err))
		return
	}
	if _, reason := g.applyState(st, time.Now()); reason != "" {
		g.drop(reason)
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.peers[st.Name]
	if p == nil || st.Name == g.cfg.Name || s.Seq < p.maxDelta {
		return // ours, or older than deltas already applied
	}
	g.rebuildDomainsLocked()
	if g.otherModelLocked(p) {
		// memberlist pairs members at random across the mesh; a snapshot of a peer outside
		// every domain of this node is not kept.
		if len(s.Added) > 0 {
			g.drop(dropOtherModel)
		}
		return
	}
	g.idx.Replace(st.Name, s.Added)
	p.maxDelta, p.seen = s.Seq, math.MaxUint64
}
