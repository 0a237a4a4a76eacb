package scalemodel

import (
	"container/heap"
	"math"
	"math/rand/v2"
	"time"
)

// RetransmitLimit is memberlist's: how many times a node sends one message of a queue whose
// NumNodes is n.
func RetransmitLimit(mult, n int) int { return mult * int(math.Ceil(math.Log10(float64(n+1)))) }

// backlogSeconds is how much budget one prefix round may cost, and so overdraw the bucket by;
// a round costing more is dropped and the domain resynced.
const backlogSeconds = 2

// Run simulates cfg and returns its prediction.
func Run(cfg Config) (Result, error) {
	if err := cfg.fill(); err != nil {
		return Result{}, err
	}
	s := newSim(cfg)
	s.run()
	return s.result(), nil
}

type message struct {
	origin int32
	size   int32
	seq    int32 // a record's sequence number
	born   float64
}

// chunk is a run of a node's pending anchor changes, oldest first: stores and evictions of
// one round, or a probe's anchors.
type chunk struct {
	born           float64
	stores, evicts int
	probe          int32 // or -1
}

type node struct {
	domain, local    int
	tokens, tokensAt float64
	records          queue
	seq              int32
	meshAt           float64 // the last record queued for the whole mesh
	directSeq        int32   // the last record sent straight to the domain, and when
	directAt         float64
	carry            float64
	pending          []chunk
	unsynced         []int32 // domain members (by local index) to send the residency to
	probes           []int32 // its probes, which its residency carries
	sent, received   float64 // prefix bytes in the measured window
}

type event struct {
	t    float64
	node int32
	kind uint8
}

const (
	evTick = iota
	evRound
	evPublish
	evPushPull
)

type events []event

func (e events) Len() int            { return len(e) }
func (e events) Less(i, j int) bool  { return e[i].t < e[j].t }
func (e events) Swap(i, j int)       { e[i], e[j] = e[j], e[i] }
func (e *events) Push(x any)         { *e = append(*e, x.(event)) }
func (e *events) Pop() (x any)       { x, *e = (*e)[len(*e)-1], (*e)[:len(*e)-1]; return x }
func (e *events) next(ev event)      { heap.Push(e, ev) }
func (e events) peek() (event, bool) { return e[0], len(e) > 0 }

type probe struct {
	at      float64
	got     int
	seen    []uint64 // the domain members holding it, by their index in the domain
	done    float64
	origin  int32
	visible bool
}

// probeAnchors is a probe's anchors: a new 2,048-token prefix is 128 blocks.
var probeAnchors = func() int {
	n := 0
	for pos := range 128 {
		if IsAnchor(pos) {
			n++
		}
	}
	return n
}()

// eps absorbs float error when comparing times on a timer's grid.
const eps = 1e-9

type sim struct {
	cfg     Config
	rng     *rand.Rand
	nodes   []node
	domains [][]int32
	ev      events
	mesh    float64 // the mesh interval, seconds
	direct  bool    // records also go straight to the domains
	// records: per viewer × origin, the newest seq held and when the viewer took it
	recSeq []int32
	recAt  []float64
	probes []probe
	// the next probe's time (+Inf: none), and the probe waited on when they go in turn
	nextProbe float64
	current   int
	start     float64 // the measured window
	end       float64
	// measured
	meshRecord, directRecord, recvRecord float64
	wire, pushPull                       float64
	changes, coalesced                   float64
	dropped, waited, resyncs             float64
	inAges, outAges                      []float64
}

func newSim(cfg Config) *sim {
	s := &sim{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))}
	n := cfg.Nodes
	s.mesh = cfg.MeshPublishInterval.Seconds()
	s.direct = cfg.MeshPublishInterval > cfg.PublishInterval
	s.nodes = make([]node, n)
	s.domains = make([][]int32, cfg.Models)
	recLimit := RetransmitLimit(cfg.RetransmitMult, n)
	for i := range s.nodes {
		d := i % cfg.Models
		s.nodes[i] = node{domain: d, local: len(s.domains[d]), tokens: float64(cfg.MaxBytesPerSecond),
			meshAt: math.Inf(-1), directAt: math.Inf(-1)}
		s.domains[d] = append(s.domains[d], int32(i))
		s.nodes[i].records = queue{limit: recLimit, byOrigin: map[int32]*entry{}}
	}
	// The mesh starts converged: every node took every record at time 0.
	s.recSeq = make([]int32, n*n)
	s.recAt = make([]float64, n*n)
	s.start = max(cfg.Warmup.Seconds(), 2*s.mesh)
	s.end = s.start + cfg.Duration.Seconds()
	s.current = -1
	s.nextProbe = s.start
	if cfg.ProbeGap == 0 {
		s.nextProbe += 0.5 * cfg.Duration.Seconds() / float64(cfg.Probes)
	}
	for i := range s.nodes {
		s.ev.next(event{t: s.rng.Float64() * cfg.GossipInterval.Seconds(), node: int32(i), kind: evTick})
		s.ev.next(event{t: s.rng.Float64() * cfg.PrefixInterval.Seconds(), node: int32(i), kind: evRound})
		s.ev.next(event{t: s.rng.Float64() * cfg.PublishInterval.Seconds(), node: int32(i), kind: evPublish})
		s.ev.next(event{t: s.rng.Float64() * s.pushPullEvery(), node: int32(i), kind: evPushPull})
	}
	return s
}

func (s *sim) run() {
	stop := s.end + s.cfg.ProbeTimeout.Seconds()
	nextSample := s.start
	for {
		ev, _ := s.ev.peek()
		if ev.t >= stop {
			return
		}
		heap.Pop(&s.ev)
		for nextSample <= ev.t && nextSample < s.end {
			s.sampleAges(nextSample)
			nextSample++
		}
		s.storeProbes(ev.t)
		switch ev.kind {
		case evTick:
			s.gossipRecords(int(ev.node), ev.t)
			ev.t += s.cfg.GossipInterval.Seconds()
		case evRound:
			s.round(int(ev.node), ev.t)
			ev.t += s.cfg.PrefixInterval.Seconds()
		case evPublish:
			s.publish(int(ev.node), ev.t)
			ev.t += s.cfg.PublishInterval.Seconds()
		case evPushPull:
			s.pushPullWith(int(ev.node), ev.t)
			ev.t += s.pushPullEvery()
		}
		s.ev.next(ev)
	}
}

func (s *sim) measuring(t float64) bool { return t >= s.start && t < s.end }

// storeProbes stores the probes due by t; when they go in turn, a probe not visible within
// the timeout lets the next one go.
func (s *sim) storeProbes(t float64) {
	to := s.cfg.ProbeTimeout.Seconds()
	if k := s.current; k >= 0 && t > s.probes[k].at+to {
		s.current = -1
		s.after(s.probes[k].at + to)
	}
	for s.nextProbe <= t {
		s.store(s.nextProbe)
	}
}

// after schedules the probe that follows one finished (visible or timed out) at t.
func (s *sim) after(t float64) {
	next := t + s.cfg.ProbeGap.Seconds()*(0.2+0.8*s.rng.Float64())
	if len(s.probes) >= s.cfg.Probes || next >= s.end {
		next = math.Inf(1)
	}
	s.nextProbe = next
}

// store puts a probe, stored at time at, on a random node: its anchors join the node's pending
// changes.
func (s *sim) store(at float64) {
	k := len(s.probes)
	s.probes = append(s.probes, probe{at: at, origin: int32(s.rng.IntN(len(s.nodes)))})
	p := &s.probes[k]
	nd := &s.nodes[p.origin]
	dom := s.domains[nd.domain]
	p.seen = make([]uint64, (len(dom)+63)/64)
	p.seen[nd.local/64] |= 1 << (nd.local % 64)
	nd.probes = append(nd.probes, int32(k))
	nd.pending = append(nd.pending, chunk{born: at, stores: probeAnchors, probe: int32(k)})
	if s.measuring(at) {
		s.changes += float64(probeAnchors)
	}
	switch {
	case s.cfg.ProbeGap > 0:
		s.current, s.nextProbe = k, math.Inf(1)
	case k+1 < s.cfg.Probes:
		s.nextProbe = s.start + (float64(k+1)+0.5)*s.cfg.Duration.Seconds()/float64(s.cfg.Probes)
	default:
		s.nextProbe = math.Inf(1)
	}
}

// pushPullEvery is memberlist's push/pull period: the interval, times ceil(log2(n/32))+1
// above 32 members.
func (s *sim) pushPullEvery() float64 {
	every := s.cfg.PushPullInterval.Seconds()
	if n := float64(len(s.nodes)); n > 32 {
		every *= math.Ceil(math.Log2(n)-5) + 1
	}
	return every
}

// anchored is a residency's anchors from its engine: a peer's resident blocks that are
// anchors, within the index's cap.
func (s *sim) anchored() int {
	if s.cfg.Resident < 0 {
		return 0
	}
	return min(int(math.Round(float64(s.cfg.Resident)*s.cfg.AnchorFraction)), s.cfg.MaxBlocksPerPeer)
}

// residency is node i's anchors: its engine's and its probes'.
func (s *sim) residency(i int) int { return s.anchored() + probeAnchors*len(s.nodes[i].probes) }

// pushPullWith is memberlist's state exchange of node a with a random member of the mesh:
// each side takes the other's record and its residency, which it keeps only inside one
// domain. Neither relays what it took.
func (s *sim) pushPullWith(a int, t float64) {
	b := s.rng.IntN(len(s.nodes) - 1)
	if b >= a {
		b++
	}
	at := t + s.cfg.HopLatency.Seconds()
	for _, pair := range [2][2]int{{a, b}, {b, a}} {
		from, to := pair[0], pair[1]
		if s.measuring(t) {
			// the record, its length and the snapshot's header (about 8 bytes), its hashes
			s.pushPull += float64(s.cfg.RecordBytes + 8 + 8*s.residency(from))
		}
		s.takeRecord(to, from, s.nodes[from].seq, at)
		if s.nodes[from].domain == s.nodes[to].domain {
			for _, k := range s.nodes[from].probes {
				s.deliver(to, int(k), at)
			}
		}
	}
}

// publish is node i's record for the period: to the whole mesh through memberlist's queue
// once a mesh interval, and to its domain with its next prefix round (round).
func (s *sim) publish(i int, t float64) {
	nd := &s.nodes[i]
	nd.seq++
	n := len(s.nodes)
	s.recSeq[i*n+i], s.recAt[i*n+i] = nd.seq, t
	if t-nd.meshAt >= s.mesh-eps {
		nd.meshAt = t
		nd.records.pushRecord(&message{origin: int32(i), size: int32(s.cfg.RecordBytes), seq: nd.seq, born: t}, t)
	}
}

// refill adds the budget's bytes since the node's last send to its bucket, which holds one
// second's worth and may be overdrawn.
func (s *sim) refill(nd *node, t float64) {
	rate := float64(s.cfg.MaxBytesPerSecond)
	nd.tokens = min(rate, nd.tokens+rate*(t-nd.tokensAt))
	nd.tokensAt = t
}

// perPacket is how many hashes a message holds.
func (s *sim) perPacket() int { return (s.cfg.MaxPayload - s.cfg.DeltaHeader) / 8 }

// messages is how many messages k hashes take.
func (s *sim) messages(k int) int { return (k + s.perPacket() - 1) / s.perPacket() }

// payload is the bytes of the messages k hashes take: full but the last, each with its header.
func (s *sim) payload(k int) int { return 8*k + s.messages(k)*s.cfg.DeltaHeader }

// cost is what k hashes cost to send to one peer, as the budget counts it.
func (s *sim) cost(k int) int { return s.payload(k) + s.messages(k)*s.cfg.PacketOverhead }

// churn adds a round's anchor changes to node i's pending ones. An engine evicts a block
// about Resident/Churn seconds after storing it (its pool is full, least recently used goes
// first), so a store still pending then becomes its eviction: the pair is one change.
func (s *sim) churn(nd *node, t float64) {
	c := &s.cfg
	nd.carry += c.Churn * c.AnchorFraction * c.PrefixInterval.Seconds()
	changes := int(nd.carry)
	nd.carry -= float64(changes)
	evicts := changes
	if c.Churn > 0 && c.Resident > 0 {
		lifetime := float64(c.Resident) / c.Churn
		for k := range nd.pending {
			ch := &nd.pending[k]
			if evicts == 0 || ch.born > t-lifetime {
				break
			}
			if n := min(ch.stores, evicts); ch.probe < 0 && n > 0 {
				ch.stores -= n
				ch.evicts += n
				evicts -= n
				if s.measuring(t) {
					s.coalesced += float64(n)
				}
			}
		}
	}
	if changes > 0 || evicts > 0 {
		nd.pending = append(nd.pending, chunk{born: t, stores: changes, evicts: evicts, probe: -1})
	}
	if s.measuring(t) {
		s.changes += float64(2 * changes)
	}
}

// directEvery is gossip's directEveryLocked: a record straight to the domain's peers every
// PublishInterval, or as often as half the budget carries it to all of them.
func directEvery(c Config, peers int) time.Duration {
	d := time.Duration(float64(peers*(c.RecordBytes+c.PacketOverhead)) / (float64(c.MaxBytesPerSecond) / 2) * float64(time.Second))
	return max(c.PublishInterval, d)
}
