package gossip

import (
	"slices"
	"time"

	"github.com/hashicorp/memberlist"
)

// flush publishes the state if it changed or is due, bounds the queue and refreshes the
// gauges.
func (g *Gossip) flush(now time.Time) {
	g.mu.Lock()
	fn := g.localFn
	g.mu.Unlock()
	var st State
	if fn != nil {
		st = fn()
	}

	g.mu.Lock()
	if fn == nil {
		st = g.local
	}
	st.Name, st.BootID, st.Seq, st.GossipAddr = g.cfg.Name, g.bootID, 0, g.selfAddr
	var out []memberlist.Broadcast
	body, err := EncodeState(st)
	for err == nil && 2+len(body) > maxMessage && len(st.Claims) > 0 {
		// Claims are the record's one optional part: one left out costs its head the mesh's
		// help, a record too large for a broadcast would cost the node its place in the mesh.
		st.Claims = st.Claims[:len(st.Claims)-1]
		body, err = EncodeState(st)
	}
	for err == nil && 2+len(body) > maxMessage && len(st.Adapters) > 0 {
		// Then adapters, the last (idle, not resident) first: the node still serves them,
		// ingresses that do not see them refuse their requests.
		st.Adapters = st.Adapters[:len(st.Adapters)-1]
		body, err = EncodeState(st)
	}
	if err != nil {
		g.log.Error("local state not encodable", "err", err)
	} else if due := now.Sub(g.pubAt) >= g.cfg.PublishInterval; due ||
		(!slices.Equal(body, g.pubBody) && now.Sub(g.pubAt) >= g.cfg.MinPublishInterval) {
		st.Seq = g.pub.Seq + 1
		msg, _ := AppendState([]byte{wireVersion, msgState}, st)
		if !sameModels(st.Models, g.pub.Models) {
			g.domainsDirty = true
		}
		g.pub, g.pubBody, g.pubAt = st, body, now
		// Every record while memberlist carries them all (up to about 32 members, as always);
		// past that, one a mesh interval and any change of structure.
		if !g.directRecordsLocked() || now.Sub(g.meshAt) >= g.meshIntervalLocked() || !sameStructure(st, g.meshPub) {
			g.meshPub, g.meshAt = st, now
			out = append(out, &namedBroadcast{name: g.cfg.Name, msg: msg})
		}
	}
	g.markStaleLocked(now)
	g.rebuildDomainsLocked()
	g.mu.Unlock()

	for _, b := range out {
		g.queue.QueueBroadcast(b)
	}
	if maxQueued := max(16, 2*g.cfg.MaxBytesPerSecond/maxMessage); g.queue.NumQueued() > maxQueued {
		n := g.queue.NumQueued()
		g.queue.Prune(maxQueued)
		// Relayed records may be queued concurrently, so the queue can have regrown already;
		// count what Prune removed at most, never a negative number.
		g.met.dropped.WithLabelValues(dropBandwidth).Add(float64(max(0, n-maxQueued)))
	}
	g.idx.Expire(now)
	is := g.idx.Stats()
	g.met.indexBytes.Set(float64(is.Bytes))
	g.met.indexBlocks.Set(float64(is.Blocks))
}

// sameStructure reports whether a and b agree on what decides where requests may go: the
// models, role, addresses and engine health. A change there goes to the whole mesh at once,
// whatever the mesh interval.
func sameStructure(a, b State) bool {
	return a.Seq != 0 && b.Seq != 0 && sameModels(a.Models, b.Models) && a.Role == b.Role &&
		a.HTTPAddr == b.HTTPAddr && a.QUICAddr == b.QUICAddr && a.EngineHealthy == b.EngineHealthy
}

// meshIntervalLocked is the interval of this node's records to the whole mesh: the configured
// one, or MeshInterval for the members alive now.
func (g *Gossip) meshIntervalLocked() time.Duration {
	if g.cfg.MeshPublishInterval > 0 {
		return g.cfg.MeshPublishInterval
	}
	return MeshInterval(g.cfg.PublishInterval, int(g.alive.Load()))
}

// directRecordsLocked reports whether records also go straight to the domains' members: once
// the mesh-wide interval is longer than PublishInterval, which they would otherwise miss.
func (g *Gossip) directRecordsLocked() bool { return g.meshIntervalLocked() > g.cfg.PublishInterval }

// directEveryLocked is how often this node's record goes straight to its domains' members:
// every PublishInterval, or, in a domain so large that that would take more than half the byte
// budget, as often as half the budget carries it to all of them, so records never crowd out
// the prefix rounds (a record is about 250 bytes with its packet: 275 members at 64 KiB/s).
func (g *Gossip) directEveryLocked() time.Duration {
	perRound := float64(g.inDomain * (len(g.pubBody) + 4 + packetOverhead))
	d := time.Duration(perRound / (float64(g.cfg.MaxBytesPerSecond) / 2) * float64(time.Second))
	return max(g.cfg.PublishInterval, d)
}

func sameModels(a, b []ModelInfo) bool {
	return slices.EqualFunc(a, b, func(x, y ModelInfo) bool { return x.Name == y.Name })
}

// sameAdapters reports whether two records list the same adapters (MembersServing's index).
func sameAdapters(a, b []Adapter) bool {
	return slices.EqualFunc(a, b, func(x, y Adapter) bool { return x.Name == y.Name })
}
