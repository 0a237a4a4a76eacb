package gossip

import (
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/kvindex"
)

// envelope counts a received message and checks its envelope; it returns the message's kind,
// or false for one dropped.
func (g *Gossip) envelope(b []byte) (kind byte, ok bool) {
	g.met.received.Add(float64(len(b)))
	if len(b) < 2 {
		g.drop(dropMalformed)
		return 0, false
	}
	if b[0] != wireVersion {
		g.drop(dropVersion)
		return 0, false
	}
	return b[1], true
}

// handleMsg is a user message from memberlist (a broadcast from any member).
func (g *Gossip) handleMsg(b []byte) {
	kind, ok := g.envelope(b)
	if !ok {
		return
	}
	now := time.Now()
	switch kind {
	case msgState:
		st, err := DecodeState(b[2:])
		if err != nil {
			g.drop(reasonOf(err))
			return
		}
		if relay, reason := g.applyState(st, now); reason != "" {
			g.drop(reason)
		} else if relay {
			g.queue.QueueBroadcast(&namedBroadcast{name: st.Name, msg: slices.Clone(b)})
		}
	case msgRecord:
		st, err := DecodeState(b[2:])
		if err != nil {
			g.drop(reasonOf(err))
			return
		}
		// Sent by its origin to this node alone: applied, never relayed.
		if _, reason := g.applyState(st, now); reason != "" {
			g.drop(reason)
		}
	case msgDelta:
		origin, boot, s, err := decodeDelta(b[2:])
		if err != nil {
			g.drop(reasonOf(err))
			return
		}
		// Deltas come from their origin and are not relayed (sendPrefixes).
		if _, reason := g.applyDelta(origin, boot, s); reason != "" {
			g.drop(reason)
		}
	case msgConflict:
		g.handleConflict(b[2:])
	default:
		g.drop(dropType)
	}
}

func (g *Gossip) drop(reason string) { g.met.dropped.WithLabelValues(reason).Inc() }

// applyState stores a peer's record if it is new; relay says whether to pass it on.
func (g *Gossip) applyState(st State, now time.Time) (relay bool, reason string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if st.Name == g.cfg.Name {
		if st.BootID != g.bootID && st.BootID != 0 && st.GossipAddr != "" && st.GossipAddr != g.selfAddr {
			// Another process publishes in this node's name from another address. (One from
			// this address is this node's previous process: its late records are ignored.)
			g.conflictLocked(conflictSelf, st.Name, g.selfAddr, st.GossipAddr, now)
			return false, dropNameConflict
		}
		return false, ""
	}
	p, reason := g.originLocked(st.Name, st.BootID, st.GossipAddr, now)
	if reason != "" {
		return false, reason
	}
	if p.hasState && st.Seq <= p.state.Seq {
		return false, ""
	}
	if !p.hasState || !sameModels(st.Models, p.state.Models) || !sameAdapters(st.Adapters, p.state.Adapters) {
		g.domainsDirty = true
	}
	if !slices.Equal(st.Claims, p.state.Claims) || len(st.Claims) > 0 && now.Sub(p.updated) > g.cfg.StaleAfter {
		// Claims changed, or came back fresh after their record had aged out of the index.
		g.claimsDirty = true
	}
	p.state, p.hasState, p.updated = st, true, now
	return true, ""
}

// applyDelta applies a peer's delta if it is new (applied).
func (g *Gossip) applyDelta(origin string, boot uint64, s kvindex.Summary) (applied bool, reason string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if origin == g.cfg.Name {
		return false, ""
	}
	p, reason := g.originLocked(origin, boot, "", time.Now())
	if reason != "" {
		return false, reason
	}
	g.rebuildDomainsLocked()
	if g.otherModelLocked(p) {
		return false, dropOtherModel
	}
	if !p.markSeen(s.Seq) {
		return false, ""
	}
	g.idx.Add(origin, s.Added)
	g.idx.Remove(origin, s.Evicted)
	return true, ""
}

// originLocked checks a message's origin, boot id and, for a record, the origin's gossip
// address (addr; "" for a delta or a record of a version without it). A new boot id means the
// member restarted: its old residency is dropped and the old id retired, so late messages of
// the previous process cannot bring it back. A record from another address than memberlist
// holds for the member is another process with its name: its boot id is refused while
// memberlist holds the member at another address than that process's (and, if its deltas got
// in first, the member's previous boot id is restored). A retired boot id is
// taken back once the current one has been silent for the member's stale age: that process is
// the live one, and a boot id never locks a live process out.
func (g *Gossip) originLocked(name string, boot uint64, addr string, now time.Time) (*peerInfo, string) {
	p := g.peers[name]
	switch {
	case name == "" || boot == 0:
		return nil, dropMalformed
	case p == nil:
		return nil, dropUnknownMember
	case p.liveness == LivenessDead || p.liveness == LivenessLeft:
		// Also a restart on another address that memberlist has not taken yet.
		return nil, dropDeadMember
	case p.refusedLocked(boot):
		return nil, dropNameConflict
	case addr != "" && p.addr != "" && addr != p.addr:
		g.refuseLocked(name, p, boot, addr, now)
		return nil, dropNameConflict
	}
	if i := slices.Index(p.retired, boot); i >= 0 {
		if now.Sub(p.heard) <= g.staleAfterLocked(p) {
			return nil, dropStaleBoot
		}
		p.retired = slices.Delete(p.retired, i, i+1)
		g.log.Info("member's earlier process is back: its later one went silent", "member", name)
	}
	if p.bootID != boot {
		if p.bootID != 0 {
			p.retired = append(p.retired, p.bootID)
			if len(p.retired) > 8 {
				p.retired = p.retired[1:]
			}
			g.resetBootLocked(name, p)
			g.log.Info("member restarted", "member", name)
		}
		p.bootID = boot
		p.incarnation++
	}
	p.heard = now
	return p, ""
}

// refuseLocked refuses boot, a process claiming name from addr, not the member's address.
func (g *Gossip) refuseLocked(name string, p *peerInfo, boot uint64, addr string, now time.Time) {
	p.refused = append(p.refused, refusal{boot: boot, addr: addr})
	if len(p.refused) > 8 {
		p.refused = p.refused[1:]
	}
	if p.bootID == boot {
		// Its deltas came before its record: back to the member's own process.
		p.bootID = 0
		if n := len(p.retired); n > 0 {
			p.bootID, p.retired = p.retired[n-1], p.retired[:n-1]
		}
		g.resetBootLocked(name, p)
		p.heard = time.Time{}
	}
	g.conflictLocked(conflictMember, name, p.addr, addr, now)
}

// refusedLocked says whether boot is refused: a process refused for its address that
// memberlist does not hold the member at now. One it does (it gave the name over to that
// address: the member restarted there) is taken off the list.
func (p *peerInfo) refusedLocked(boot uint64) bool {
	i := slices.IndexFunc(p.refused, func(r refusal) bool { return r.boot == boot })
	if i < 0 {
		return false
	}
	if p.refused[i].addr != p.addr {
		return true
	}
	p.refused = slices.Delete(p.refused, i, i+1)
	return false
}

// resetBootLocked forgets what p's previous process said: its residency and record.
func (g *Gossip) resetBootLocked(name string, p *peerInfo) {
	g.idx.DropPeer(name)
	p.hasState, p.maxDelta, p.seen = false, 0, 0
	g.domainsDirty = true
}

func (p *peerInfo) markSeen(seq uint64) bool {
	if seq > p.maxDelta {
		if d := seq - p.maxDelta; d >= 64 {
			p.seen = 0
		} else {
			p.seen <<= d
		}
		p.seen |= 1
		p.maxDelta = seq
		return true
	}
	d := p.maxDelta - seq
	if d >= 64 || p.seen&(1<<d) != 0 {
		return false
	}
	p.seen |= 1 << d
	return true
}
