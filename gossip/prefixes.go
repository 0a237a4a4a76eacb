package gossip

import (
	"slices"
	"time"

	"github.com/hashicorp/memberlist"

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

// sendPrefixes is one prefix round, every PrefixInterval: this node's deltas, coalesced since
// the last round, go straight to every alive member of its domains, and its whole residency to
// the members that have not been sent it (synced). Nothing is relayed: each member receives
// each delta once, from its origin, which is the least any scheme that keeps every member's
// view whole can send, where an epidemic sends every delta its retransmit limit's times over.
// A round is sent whole while the byte budget's bucket is not in debt, and may overdraw it by
// up to two seconds' worth, so a round to a large domain is never too big to go: the next
// rounds (and state records) wait until the bucket is back above zero, which holds the average
// to the budget. A round past two seconds of budget is dropped, and the members it was for are
// sent the residency again instead, a few a round.
func (g *Gossip) sendPrefixes(now time.Time) {
	g.mu.Lock()
	if g.ml == nil && g.sendTo == nil {
		g.mu.Unlock()
		return
	}
	g.rebuildDomainsLocked()
	var names []string
	for _, d := range g.domains {
		names = append(names, d.members...)
	}
	if len(g.domains) > 1 {
		slices.Sort(names)
		names = slices.Compact(names) // a member in two of this node's domains is sent once
	}
	to := make([]*peerInfo, len(names))
	for i, name := range names {
		to[i] = g.peers[name]
	}
	if len(to) == 0 || g.dropDeltas.Load() {
		g.clearPendLocked() // no one to tell: a member joining later is sent the residency
		g.mu.Unlock()
		return
	}
	g.refillLocked(now)
	// This node's record, straight to the domains' members, when the mesh-wide gossip carries
	// it too seldom for them: to each member every PublishInterval, at most half the budget a
	// round, going round the members from where the last round stopped (so in a domain too
	// large for that, each gets it every directEveryLocked). It is small and goes first,
	// whatever the bucket's debt, so a prefix round's overdraft never makes this node stale.
	// A member not yet synced gets it with the residency (sync).
	var rec []byte
	var recTo []int
	if g.directRecordsLocked() && g.pub.Seq > 0 {
		rec, _ = AppendState([]byte{wireVersion, msgRecord}, g.pub)
		cost := len(rec) + packetOverhead
		budget := max(cost, int(float64(g.cfg.MaxBytesPerSecond)/2*g.cfg.PrefixInterval.Seconds()))
		spent, start := 0, g.recNext%len(to)
		for k := range to {
			i := (start + k) % len(to)
			p := to[i]
			if p.synced != p.bootID || now.Sub(p.recAt) < g.cfg.PublishInterval {
				continue
			}
			if spent+cost > budget {
				break
			}
			recTo, spent, p.recAt, g.recNext = append(recTo, i), spent+cost, now, i+1
		}
		g.tokens -= float64(spent)
	}
	var deltas [][]byte
	if deltas = g.deltaMessagesLocked(); len(deltas) > 0 {
		cost := float64(len(to) * bytesOf(deltas))
		switch {
		case g.tokens > 0 && cost <= 2*float64(g.cfg.MaxBytesPerSecond):
			g.clearPendLocked()
			g.tokens -= cost
		case g.tokens > 0:
			g.clearPendLocked()
			g.met.dropped.WithLabelValues(dropBandwidth).Add(float64(len(deltas)))
			for _, p := range to {
				p.synced = 0
			}
			deltas = nil
		default:
			deltas = nil // wait for the budget; the pending changes keep coalescing
		}
	}
	g.deltaSeq += uint64(len(deltas))
	var unsynced []*peerInfo
	var unsyncedNames []string
	for i, p := range to {
		if p.synced != p.bootID {
			unsynced = append(unsynced, p)
			unsyncedNames = append(unsyncedNames, names[i])
		}
	}
	fn, send := g.snapshotFn, g.sendTo
	if send == nil {
		send = g.ml.SendToAddress
	}
	addrs := make([]memberlist.Address, len(to))
	for i, p := range to {
		addrs[i] = memberlist.Address{Addr: p.addr, Name: names[i]}
	}
	g.mu.Unlock()

	sent := 0
	for _, i := range recTo {
		sent += g.send(send, addrs[i], rec)
	}
	for _, a := range addrs {
		for _, msg := range deltas {
			sent += g.send(send, a, msg)
		}
	}
	if len(unsynced) > 0 {
		sent += g.sync(now, send, fn, unsynced, unsyncedNames)
	}
	if sent > 0 {
		g.met.sent.Add(float64(sent))
	}
}

// sync sends this node's residency, as deltas of added blocks, to the members in to, as many
// as the budget allows this round, after its record when records go straight to the domains. A member that held some of it stale (it missed evictions
// in a dropped backlog) keeps those until the next push/pull snapshot replaces its view.
func (g *Gossip) sync(now time.Time, send func(memberlist.Address, []byte) error, fn func() []uint64, to []*peerInfo, names []string) int {
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
	cost := float64(bytesOf(msgs))
	if cost > 2*float64(g.cfg.MaxBytesPerSecond) {
		// Past what a round may overdraw: the push/pull snapshot brings these members up to date.
		for _, p := range to {
			p.synced = p.bootID
		}
		g.mu.Unlock()
		g.met.dropped.WithLabelValues(dropBandwidth).Inc()
		return 0
	}
	var addrs []memberlist.Address
	for i, p := range to {
		if g.tokens <= 0 {
			break // the rest at a later round
		}
		g.tokens -= cost
		p.synced = p.bootID
		if withRecord {
			p.recAt = now
		}
		addrs = append(addrs, memberlist.Address{Addr: p.addr, Name: names[i]})
	}
	g.mu.Unlock()
	sent := 0
	for _, a := range addrs {
		for _, msg := range msgs {
			sent += g.send(send, a, msg)
		}
	}
	return sent
}

// send sends msg to a and returns the bytes it cost.
func (g *Gossip) send(send func(memberlist.Address, []byte) error, a memberlist.Address, msg []byte) int {
	if err := send(a, msg); err != nil {
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

// refillLocked adds the budget's bytes since the last refill to the bucket, which holds one
// second's worth at most.
func (g *Gossip) refillLocked(now time.Time) {
	rate := float64(g.cfg.MaxBytesPerSecond)
	if g.tokensAt.IsZero() {
		g.tokens = rate
	} else {
		g.tokens = min(rate, g.tokens+rate*now.Sub(g.tokensAt).Seconds())
	}
	g.tokensAt = now
}
