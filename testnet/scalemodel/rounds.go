package scalemodel

import "slices"

// round is node i's prefix round (gossip's sendPrefixes): its record, when records go
// straight to the domain and one is new, then its pending anchor changes, whole, to every
// other member of its domain while the bucket is above zero (overdrawing it by up to two
// seconds' worth; below zero they wait and keep coalescing); a round past two seconds of
// budget is dropped and the domain resynced, a few members a round as the bucket allows.
func (s *sim) round(i int, t float64) {
	c := &s.cfg
	nd := &s.nodes[i]
	s.refill(nd, t)
	s.churn(nd, t)
	dom := s.domains[nd.domain]
	peers := len(dom) - 1
	at := t + c.HopLatency.Seconds()
	rate := float64(c.MaxBytesPerSecond)
	measuring := s.measuring(t)
	record := false
	if s.direct && nd.seq > nd.directSeq && t-nd.directAt >= directEvery(*c, peers).Seconds()-eps && nd.tokens > 0 {
		record = true
		nd.directSeq, nd.directAt = nd.seq, t
		nd.tokens -= float64(peers * (c.RecordBytes + c.PacketOverhead))
		for _, to := range dom {
			if int(to) != i {
				s.takeRecord(int(to), i, nd.seq, at)
			}
		}
		if measuring {
			s.directRecord += float64(peers * (c.RecordBytes + c.PacketOverhead))
			s.recvRecord += float64(peers * c.RecordBytes)
		}
	}
	pending := 0
	for _, ch := range nd.pending {
		pending += ch.stores + ch.evicts
	}
	if pending > 0 {
		cost := float64(peers * s.cost(pending))
		switch {
		case nd.tokens > 0 && cost <= backlogSeconds*rate:
			nd.tokens -= cost
			s.sendPending(i, t, at)
		case nd.tokens > 0:
			if measuring {
				s.dropped += float64(pending)
			}
			nd.pending = nd.pending[:0]
			nd.unsynced = nd.unsynced[:0]
			for _, to := range dom {
				if int(to) != i {
					nd.unsynced = append(nd.unsynced, int32(s.nodes[to].local))
				}
			}
		}
	}
	if len(nd.unsynced) > 0 {
		s.resync(i, t, at, !record)
	}
}

// sendPending sends node i's pending changes to its domain: a probe is delivered with them.
func (s *sim) sendPending(i int, t, at float64) {
	nd := &s.nodes[i]
	dom := s.domains[nd.domain]
	measuring := s.measuring(t)
	k := 0
	for _, ch := range nd.pending {
		k += ch.stores + ch.evicts
		if measuring && ch.born <= t-s.cfg.PrefixInterval.Seconds()+eps {
			s.waited += float64(ch.stores + ch.evicts)
		}
		if ch.probe >= 0 {
			for _, to := range dom {
				if int(to) != i {
					s.deliver(int(to), int(ch.probe), at)
				}
			}
		}
	}
	nd.pending = nd.pending[:0]
	if measuring {
		s.countPrefix(i, s.cost(k), s.payload(k), len(dom)-1)
	}
}

// countPrefix counts messages of cost bytes (payload of them received) from node i to each of
// peers members of its domain.
func (s *sim) countPrefix(i, cost, payload, peers int) {
	s.nodes[i].sent += float64(cost * peers)
	for _, to := range s.domains[s.nodes[i].domain] {
		if int(to) != i {
			s.nodes[to].received += float64(payload)
		}
	}
}

// resync sends node i's residency (and its record, withRecord, when records go straight to
// the domain) to its unsynced members while the bucket is above zero; a residency over two
// seconds of budget is not sent at all, left to push/pull (gossip's sync).
func (s *sim) resync(i int, t, at float64, withRecord bool) {
	c := &s.cfg
	nd := &s.nodes[i]
	dom := s.domains[nd.domain]
	hashes := s.residency(i)
	cost, payload := s.cost(hashes), s.payload(hashes)
	record := withRecord && s.direct && nd.seq > 0
	if record {
		cost += c.RecordBytes + c.PacketOverhead
		payload += c.RecordBytes
	}
	if float64(cost) > backlogSeconds*float64(c.MaxBytesPerSecond) {
		nd.unsynced = nd.unsynced[:0]
		return
	}
	n := 0
	for ; n < len(nd.unsynced) && nd.tokens > 0; n++ {
		nd.tokens -= float64(cost)
		to := int(dom[nd.unsynced[n]])
		for _, k := range nd.probes {
			s.deliver(to, int(k), at)
		}
		if record {
			s.takeRecord(to, i, nd.seq, at)
		}
		if s.measuring(t) {
			s.resyncs++
			nd.sent += float64(cost)
			s.nodes[to].received += float64(payload)
		}
	}
	nd.unsynced = slices.Delete(nd.unsynced, 0, n)
}

// gossipRecords is node i's memberlist gossip tick: a packet of queued records to each of
// GossipNodes random members of the mesh, within the bucket.
func (s *sim) gossipRecords(i int, t float64) {
	nd := &s.nodes[i]
	s.refill(nd, t)
	// kvmesh prunes memberlist's queue to two seconds of budget in messages.
	nd.records.prune(max(16, backlogSeconds*s.cfg.MaxBytesPerSecond/s.cfg.MaxPayload))
	if nd.records.live == 0 {
		return
	}
	n := len(s.nodes)
	var picked [8]int32
	targets := s.pick(picked[:0], int32(i), n)
	for _, to := range targets {
		msgs := nd.records.take(t, min(s.cfg.PacketBytes, int(nd.tokens)), 2)
		if len(msgs) == 0 {
			return
		}
		bytes := 0
		for _, m := range msgs {
			bytes += int(m.size) + 2
			s.deliverRecord(int(to), m, t+s.cfg.HopLatency.Seconds())
		}
		nd.tokens -= float64(bytes)
		if s.measuring(t) {
			s.meshRecord += float64(bytes)
			s.recvRecord += float64(bytes - 2*len(msgs))
			s.wire += float64(bytes + s.cfg.PacketOverhead)
		}
	}
}

// pick appends up to GossipNodes distinct members of the mesh other than self.
func (s *sim) pick(dst []int32, self int32, n int) []int32 {
	k := min(s.cfg.GossipNodes, n-1, cap(dst))
	for len(dst) < k {
		c := int32(s.rng.IntN(n))
		if c != self && !slices.Contains(dst, c) {
			dst = append(dst, c)
		}
	}
	return dst
}

// deliverRecord is a record through memberlist: taken if newer, and then relayed.
func (s *sim) deliverRecord(to int, m *message, at float64) {
	if s.takeRecord(to, int(m.origin), m.seq, at) {
		s.nodes[to].records.pushRecord(m, at)
	}
}

// takeRecord gives node to origin's record seq at time at, and reports whether it was new.
func (s *sim) takeRecord(to, origin int, seq int32, at float64) bool {
	k := to*len(s.nodes) + origin
	if origin == to || seq <= s.recSeq[k] {
		return false
	}
	s.recSeq[k], s.recAt[k] = seq, at
	return true
}

// deliver gives node to probe k's anchors at time at.
func (s *sim) deliver(to, k int, at float64) {
	p := &s.probes[k]
	local := s.nodes[to].local
	w, b := local/64, uint64(1)<<(local%64)
	if p.seen[w]&b != 0 {
		return
	}
	p.seen[w] |= b
	p.got++
	if p.got == len(s.domains[s.nodes[to].domain])-1 && at-p.at <= s.cfg.ProbeTimeout.Seconds() {
		p.visible, p.done = true, at
		if k == s.current {
			s.current = -1
			s.after(at)
		}
	}
}
