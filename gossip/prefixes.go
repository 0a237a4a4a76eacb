package gossip

import (
	"slices"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/kvmesh/kvmesh/gossip/round"
	"github.com/kvmesh/kvmesh/kvindex"
)

// PrefixStored records that this node's engine stored blocks; they are in the local index at
// once and broadcast, coalesced, at the next flush.
func (g *Gossip) PrefixStored(blocks []uint64) { g.queueDelta(blocks, true) }

// PrefixEvicted records that this node's engine evicted blocks.
func (g *Gossip) PrefixEvicted(blocks []uint64) { g.queueDelta(blocks, false) }

func (g *Gossip) queueDelta(blocks []uint64, stored bool) {
	if len(blocks) == 0 {
		return
	}
	if stored {
		g.idx.Add(g.cfg.Name, blocks)
	} else {
		g.idx.Remove(g.cfg.Name, blocks)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, h := range blocks {
		if _, ok := g.pend[h]; !ok {
			g.pendOrder = append(g.pendOrder, h)
		}
		g.pend[h] = stored
	}
	if limit := g.idx.MaxBlocksPerPeer(); len(g.pend) > limit {
		// More change than one snapshot holds: send none of it; the members are sent the
		// residency again (sync), as after a dropped round.
		g.met.dropped.WithLabelValues(dropBandwidth).Inc()
		clear(g.pend)
		g.pendOrder = g.pendOrder[:0]
		for _, p := range g.peers {
			p.synced = 0
		}
	}
}

// directSender sends one message straight to one member, not relayed: memberlist's
// SendToAddress, or what newGossip was given.
type directSender interface {
	SendToAddress(a memberlist.Address, msg []byte) error
}

var _ directSender = (*memberlist.Memberlist)(nil)

// sendPrefixes is one prefix round, every PrefixInterval: this node's deltas, coalesced since
// the last round, go straight to every alive member of its domains, and its whole residency to
// the members that have not been sent it (synced). Nothing is relayed: each member receives
// each delta once, from its origin, which is the least any scheme that keeps every member's
// view whole can send, where an epidemic sends every delta its retransmit limit's times over.
// A round is sent whole while the byte budget's bucket is not in debt, and may overdraw it by
// up to two seconds' worth, so a round to a large domain is never too big to go: the next
// rounds (and state records) wait until the bucket is back above zero, which holds the average
// to the budget. A round past two seconds of budget is dropped, and the members it was for are
// sent the residency again instead, a few a round. Package round plans it (round.PlanRound).
func (g *Gossip) sendPrefixes(now time.Time) {
	g.mu.Lock()
	r, ok := g.planRoundLocked(now)
	g.mu.Unlock()
	if !ok {
		return
	}
	sent := 0
	for _, a := range r.recTo {
		sent += g.send(r.direct, a, r.rec)
	}
	for _, a := range r.to {
		for _, msg := range r.deltas {
			sent += g.send(r.direct, a, msg)
		}
	}
	if len(r.unsynced) > 0 {
		sent += g.sync(now, r.direct, r.snapshot, r.unsynced, r.unsyncedNames)
	}
	if sent > 0 {
		g.met.sent.Add(float64(sent))
	}
}

// plannedRound is a prefix round planned under the lock, to send once it is released.
type plannedRound struct {
	direct   directSender
	snapshot func() []uint64
	// rec is this node's record, to the members in recTo; deltas are the pending deltas, to
	// every member in to.
	rec    []byte
	recTo  []memberlist.Address
	deltas [][]byte
	to     []memberlist.Address
	// unsynced are the members to be sent the residency (sync), and their names.
	unsynced      []*peerInfo
	unsyncedNames []string
}

// planRoundLocked plans a prefix round over the members of this node's domains
// (round.PlanRound) and applies the plan to their state and the budget; ok is false when
// there is nothing to send (before Start, or no one in the domains).
//
// This node's record goes straight to the domains' members when the mesh-wide gossip carries
// it too seldom for them: to each member every PublishInterval, at most half the budget a
// round, going round the members from where the last round stopped (so in a domain too large
// for that, each gets it every directEveryLocked). It is small and goes first, whatever the
// bucket's debt, so a prefix round's overdraft never makes this node stale. A member not yet
// synced gets it with the residency (sync).
func (g *Gossip) planRoundLocked(now time.Time) (r plannedRound, ok bool) {
	if g.direct == nil {
		return r, false
	}
	g.rebuildDomainsLocked()
	names := round.Recipients(g.domainMembersLocked())
	if len(names) == 0 {
		g.clearPendLocked() // no one to tell: a member joining later is sent the residency
		return r, false
	}
	g.budget.Refill(now)
	in := round.Round{
		Now: now, Interval: g.cfg.PrefixInterval, Members: make([]round.Member, len(names)),
		Budget: g.budget, RecordEvery: g.cfg.PublishInterval, RecordNext: g.recNext,
	}
	to := make([]*peerInfo, len(names))
	for i, name := range names {
		p := g.peers[name]
		to[i], in.Members[i] = p, round.Member{Synced: p.synced == p.bootID, RecordAt: p.recAt}
	}
	r = plannedRound{direct: g.direct, snapshot: g.snapshotFn, deltas: g.deltaMessagesLocked()}
	if g.directRecordsLocked() && g.pub.Seq > 0 {
		r.rec, _ = AppendState([]byte{wireVersion, msgRecord}, g.pub)
		in.Record = len(r.rec) + packetOverhead
	}
	in.Deltas, in.DeltaBytes = len(r.deltas), bytesOf(r.deltas)

	plan := round.PlanRound(in)
	g.budget, g.recNext = plan.Budget, plan.RecordNext
	for _, i := range plan.Records {
		to[i].recAt = now
		r.recTo = append(r.recTo, addrOf(names[i], to[i]))
	}
	switch plan.Deltas {
	case round.DeltasSend:
		g.clearPendLocked()
	case round.DeltasDrop:
		g.clearPendLocked()
		g.met.dropped.WithLabelValues(dropBandwidth).Add(float64(len(r.deltas)))
		for _, p := range to {
			p.synced = 0
		}
		r.deltas = nil
	default:
		r.deltas = nil // none, or waiting for the budget: the pending changes keep coalescing
	}
	g.deltaSeq += uint64(len(r.deltas))
	for _, i := range plan.Resync {
		r.unsynced, r.unsyncedNames = append(r.unsynced, to[i]), append(r.unsyncedNames, names[i])
	}
	r.to = make([]memberlist.Address, len(to))
	for i, p := range to {
		r.to[i] = addrOf(names[i], p)
	}
	return r, true
}

func addrOf(name string, p *peerInfo) memberlist.Address {
	return memberlist.Address{Addr: p.addr, Name: name}
}

// sync sends this node's residency, as deltas of added blocks, to the members in to, as many
// as the budget allows this round (round.PlanSync), after its record when records go straight
// to the domains. A member that held some of it stale (it missed evictions in a dropped
// backlog) keeps those until the next push/pull snapshot replaces its view.
func (g *Gossip) sync(now time.Time, direct directSender, fn func() []uint64, to []*peerInfo, names []string) int {
	blocks := g.residency(fn)
	g.mu.Lock()
	msgs := g.summaryMessagesLocked(blocks, nil)
	g.deltaSeq += uint64(len(msgs))
	withRecord := g.directRecordsLocked() && g.pub.Seq > 0
	if withRecord {
		// A new member may wait a mesh interval for this node's record otherwise.
		rec, _ := AppendState([]byte{wireVersion, msgRecord}, g.pub)
		msgs = append([][]byte{rec}, msgs...)
	}
	plan := round.PlanSync(g.budget, bytesOf(msgs), len(to))
	g.budget = plan.Budget
	if plan.TooLarge {
		// Past what a round may overdraw: the push/pull snapshot brings these members up to date.
		for _, p := range to {
			p.synced = p.bootID
		}
		g.mu.Unlock()
		g.met.dropped.WithLabelValues(dropBandwidth).Inc()
		return 0
	}
	addrs := make([]memberlist.Address, plan.Send)
	for i, p := range to[:plan.Send] {
		p.synced = p.bootID
		if withRecord {
			p.recAt = now
		}
		addrs[i] = addrOf(names[i], p)
	}
	g.mu.Unlock()
	sent := 0
	for _, a := range addrs {
		for _, msg := range msgs {
			sent += g.send(direct, a, msg)
		}
	}
	return sent
}

// send sends msg to a and returns the bytes it cost.
func (g *Gossip) send(direct directSender, a memberlist.Address, msg []byte) int {
	if err := direct.SendToAddress(a, msg); err != nil {
		g.log.Debug("prefix summary not sent", "member", a.Name, "err", err)
		return 0
	}
	return len(msg) + packetOverhead
}

// deltaMessagesLocked cuts the pending deltas into messages that each fit one packet; it
// leaves them pending (clearPendLocked takes them).
func (g *Gossip) deltaMessagesLocked() [][]byte {
	if len(g.pendOrder) == 0 {
		return nil
	}
	var added, evicted []uint64
	for _, h := range g.pendOrder {
		if g.pend[h] {
			added = append(added, h)
		} else {
			evicted = append(evicted, h)
		}
	}
	return g.summaryMessagesLocked(added, evicted)
}

func (g *Gossip) clearPendLocked() {
	clear(g.pend)
	g.pendOrder = g.pendOrder[:0]
}

// summaryMessagesLocked cuts added and evicted blocks into delta messages that each fit one
// packet, numbered from deltaSeq+1 on.
func (g *Gossip) summaryMessagesLocked(added, evicted []uint64) [][]byte {
	head := deltaHeader(g.cfg.Name, g.bootID)
	per := (maxMessage - len(head) - 32) / 8
	var out [][]byte
	seq := g.deltaSeq
	for len(added)+len(evicted) > 0 {
		var s kvindex.Summary
		n := min(per, len(added))
		s.Added, added = added[:n], added[n:]
		m := min(per-n, len(evicted))
		s.Evicted, evicted = evicted[:m], evicted[m:]
		seq++
		s.Seq = seq
		msg, _ := s.AppendBinary(slices.Clip(head))
		out = append(out, msg)
	}
	return out
}

// residency is this node's whole residency, least recent first, at most what the index keeps
// of a peer: fn's (SetSnapshot) or, without one, the index's record of PrefixStored.
func (g *Gossip) residency(fn func() []uint64) []uint64 {
	var blocks []uint64
	if fn != nil {
		blocks = fn()
	} else {
		blocks = g.idx.AppendPeerBlocks(nil, g.cfg.Name)
	}
	if limit := g.idx.MaxBlocksPerPeer(); len(blocks) > limit {
		blocks = blocks[len(blocks)-limit:]
	}
	return blocks
}
