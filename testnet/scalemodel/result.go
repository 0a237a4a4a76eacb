package scalemodel

import (
	"math"
	"slices"
	"time"
)

// Result is what a scenario predicts. Bytes are a node's a second, counted as kvmesh counts
// them (kvmesh_gossip_sent_bytes_total, kvmesh_gossip_received_bytes_total): a record that
// memberlist carries is its bytes and 2; a message kvmesh sends on its own (a delta, a
// resync, a direct record) its bytes and PacketOverhead, as the budget counts it; received
// bytes are the messages' bytes, and push/pull's.
type Result struct {
	Nodes, Models, Domain int
	// MeshInterval is the records' interval to the whole mesh; DirectRecords says records
	// also go straight to the domains' members (MeshInterval is over PublishInterval).
	MeshInterval  time.Duration
	DirectRecords bool
	RecordLimit   int // memberlist's transmissions of a record

	Probes                 int // stored
	VisibleP50, VisibleP99 time.Duration
	Visible                float64 // share of probes every domain member held in time

	// Record ages as kvmesh reads them (since the viewer last took a newer record of the
	// origin), sampled once a simulated second over (viewer, origin) pairs in one domain (In)
	// and in different domains (Out); Stale is the share past the viewer's threshold for that
	// origin: StaleAfter in a domain (or three direct intervals in one past ~275 peers),
	// OutStaleAfter outside it.
	InAgeP50, InAgeP99   time.Duration
	InStale              float64
	OutAgeP50, OutAgeP99 time.Duration
	OutStale             float64
	OutStaleAfter        time.Duration

	MeshRecordBytes            float64 // memberlist's record transmissions
	DirectRecordBytes          float64 // records straight to the domain's members
	PrefixSent, PrefixReceived float64 // deltas and resyncs
	PushPullBytes              float64 // received over memberlist's push/pull: records and snapshots
	Sent, Received             float64 // all of the above, as the metrics count them
	WireBytes                  float64 // Sent and the record packets' framing (not push/pull)
	// PrefixDemand is what a node's deltas would cost sent every round with no budget (every
	// anchor change to every domain peer, packed as one round packs them). Of the anchor
	// changes, Coalesced is the share that met their block's eviction while pending (the pair
	// goes as one eviction), Dropped the share dropped in a round over two seconds of budget
	// (the domain is resynced), Waited the share sent a round or more late. Resyncs is the
	// residency sends a node makes a second after dropped rounds.
	PrefixDemand               float64
	Coalesced, Dropped, Waited float64
	Resyncs                    float64
	// JoinBurst is what a node joining a domain receives at once: every member's anchored
	// residency (and record, with direct records), in messages.
	JoinBurst float64
	// IndexBytes is the prefix index's heap a node: every domain peer's anchored residency at
	// Resident, and the probes' anchors, which stay (as in BenchmarkScale's pools).
	IndexBytes float64
}

// sampleAges samples record ages at t: pairs in one domain, and in different ones.
func (s *sim) sampleAges(t float64) {
	n := len(s.nodes)
	age := func(v, o int) float64 { return max(0, t-s.recAt[v*n+o]) }
	for range 1000 {
		v := s.rng.IntN(n)
		dom := s.domains[s.nodes[v].domain]
		j := s.rng.IntN(len(dom) - 1)
		if j >= s.nodes[v].local {
			j++
		}
		s.inAges = append(s.inAges, age(v, int(dom[j])))
		if s.cfg.Models > 1 {
			o := s.rng.IntN(n)
			for s.nodes[o].domain == s.nodes[v].domain {
				o = s.rng.IntN(n)
			}
			s.outAges = append(s.outAges, age(v, o))
		}
	}
}

func (s *sim) result() Result {
	c := s.cfg
	dom := c.Nodes / c.Models
	r := Result{Nodes: c.Nodes, Models: c.Models, Domain: dom, RecordLimit: RetransmitLimit(c.RetransmitMult, c.Nodes),
		MeshInterval: c.MeshPublishInterval, DirectRecords: s.direct, Probes: len(s.probes)}
	per := float64(c.Nodes) * c.Duration.Seconds()
	var sent, received float64
	for _, nd := range s.nodes {
		sent += nd.sent
		received += nd.received
	}
	r.MeshRecordBytes, r.DirectRecordBytes = s.meshRecord/per, s.directRecord/per
	r.PrefixSent, r.PrefixReceived = sent/per, received/per
	r.PushPullBytes = s.pushPull / per
	r.Sent = r.MeshRecordBytes + r.DirectRecordBytes + r.PrefixSent
	r.Received = s.recvRecord/per + r.PrefixReceived + r.PushPullBytes
	r.WireBytes = r.Sent + (s.wire-s.meshRecord)/per
	r.Resyncs = s.resyncs / per
	if s.changes > 0 {
		r.Coalesced, r.Dropped, r.Waited = s.coalesced/s.changes, s.dropped/s.changes, s.waited/s.changes
	}
	perRound := 2 * c.Churn * c.AnchorFraction * c.PrefixInterval.Seconds()
	r.PrefixDemand = float64(dom-1) * float64(s.cost(int(math.Round(perRound)))) / c.PrefixInterval.Seconds()
	r.JoinBurst = float64(dom-1) * float64(s.cost(s.anchored()))
	if s.direct {
		r.JoinBurst += float64((dom - 1) * (c.RecordBytes + c.PacketOverhead))
	}
	var lat []float64
	held := 0.0
	for _, p := range s.probes {
		held += float64(probeAnchors * (len(s.domains[s.nodes[p.origin].domain]) - 1))
		if p.visible {
			lat = append(lat, p.done-p.at)
		}
	}
	if len(s.probes) > 0 {
		r.Visible = float64(len(lat)) / float64(len(s.probes))
	}
	r.VisibleP50, r.VisibleP99 = quantile(lat, 0.5), quantile(lat, 0.99)
	r.OutStaleAfter = c.StaleAfter
	inStale := c.StaleAfter
	if s.direct {
		r.OutStaleAfter = max(c.StaleAfter, 3*c.MeshPublishInterval)
		inStale = max(c.StaleAfter, 3*min(c.MeshPublishInterval, directEvery(c, dom-1)))
	}
	r.InAgeP50, r.InAgeP99, r.InStale = ages(s.inAges, inStale)
	r.OutAgeP50, r.OutAgeP99, r.OutStale = ages(s.outAges, r.OutStaleAfter)
	// Its domain peers' residency, no block shared, and the probes' anchors a node holds.
	r.IndexBytes = (float64((dom-1)*s.anchored()) + held/float64(c.Nodes)) * (c.EntryBytes + c.DistinctBytes)
	return r
}

// ages is the p50 and p99 of sampled ages and the share past stale.
func ages(v []float64, stale time.Duration) (p50, p99 time.Duration, share float64) {
	n := 0
	for _, a := range v {
		if a > stale.Seconds() {
			n++
		}
	}
	if len(v) > 0 {
		share = float64(n) / float64(len(v))
	}
	return quantile(v, 0.5), quantile(v, 0.99), share
}

// quantile is the q-quantile of v in seconds as a Duration (the largest if v has fewer than
// 1/(1-q) values); an infinite value saturates, and no value is 0.
func quantile(v []float64, q float64) time.Duration {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	x := v[min(int(q*float64(len(v))), len(v)-1)]
	if math.IsInf(x, 1) || x*1e9 >= math.MaxInt64 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(x * 1e9)
}
