package scalemodel

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Config is one scenario: the mesh, kvmesh's gossip settings, the workload, the inputs fitted
// on measurements, and the run. Zero fields take DefaultConfig's values.
type Config struct {
	// Nodes is the mesh's size; Models splits it evenly into that many prefix domains, a
	// node serving one model (1: every node serves the same model).
	Nodes  int
	Models int

	// memberlist's settings, which carry the mesh-wide state records (gossip.Config's
	// defaults).
	GossipInterval   time.Duration // memberlist's GossipInterval: 200 ms
	GossipNodes      int           // memberlist's GossipNodes: 3
	RetransmitMult   int           // 4
	PacketBytes      int           // a memberlist gossip packet's payload: 1,369 bytes
	PushPullInterval time.Duration // 10 s, scaled as memberlist scales it above 32 members

	// kvmesh's records: a node publishes one every PublishInterval, and one every
	// MeshPublishInterval (zero: MeshInterval(PublishInterval, Nodes)) goes through memberlist
	// to the whole mesh. Once that is longer than PublishInterval, each record also goes
	// straight to the node's domain members with its next prefix round, and a peer outside
	// the viewer's domain is stale only past three mesh intervals, not StaleAfter.
	PublishInterval     time.Duration // 1 s
	MeshPublishInterval time.Duration
	StaleAfter          time.Duration // 3 s

	// kvmesh's prefix gossip: every PrefixInterval a node sends its pending anchor deltas to
	// each member of its domain, in messages of at most MaxPayload bytes (DeltaHeader of them
	// the delta's header), within MaxBytesPerSecond for everything it sends.
	PrefixInterval    time.Duration // 500 ms
	MaxPayload        int           // 1,024 bytes
	DeltaHeader       int           // envelope, origin, boot id, seq, counts: 20 bytes (fitted)
	MaxBytesPerSecond int           // 64 KiB/s

	// The workload: Churn blocks stored a second a node, and as many evicted (its pool is
	// full), AnchorFraction of them anchors; Resident blocks held by each engine (negative:
	// none, as BenchmarkScale's pools without churn), MaxBlocksPerPeer the index's cap on a
	// peer's entries.
	Churn            float64
	AnchorFraction   float64
	Resident         int
	MaxBlocksPerPeer int

	// Inputs fitted on the 16-, 32- and 64-node measurements (docs/performance.md, "Scale").
	HopLatency     time.Duration // a send to the receiver's use of it, the harness's polling included: 3 ms
	RecordBytes    int           // a state record with its envelope: 207 bytes (a light node's: 122)
	PacketOverhead int           // what kvmesh counts a message sent on its own besides its bytes: 31
	EntryBytes     float64       // the index's heap a (peer, block) entry: 48
	DistinctBytes  float64       // and a distinct hash: 112 (no block shared between peers)

	// The run: Warmup of simulated time (at least two mesh intervals), then Duration measured
	// with Probes new prefixes; a probe not visible ProbeTimeout after it was stored counts as
	// not visible. ProbeGap, when set, stores the probes as BenchmarkScale does: one after
	// another, the next a random gap of ProbeGap/5 to ProbeGap after the last was visible or
	// timed out, at most Probes within Duration; zero spreads Probes evenly over Duration.
	Warmup, Duration, ProbeTimeout time.Duration
	Probes                         int
	ProbeGap                       time.Duration
	Seed                           uint64
}

// DefaultConfig is kvmesh's defaults with the Mooncake conversation trace's per-node churn
// (1,180 blocks a second, testnet's BenchmarkScale) and anchor fraction on simulated H100
// pools (29,206 blocks), and the inputs fitted on BenchmarkScale's light nodes.
func DefaultConfig() Config {
	return Config{
		Nodes:             128,
		Models:            1,
		GossipInterval:    200 * time.Millisecond,
		GossipNodes:       3,
		RetransmitMult:    4,
		PacketBytes:       1400 - 2 - 29,
		PushPullInterval:  10 * time.Second,
		PublishInterval:   time.Second,
		StaleAfter:        3 * time.Second,
		PrefixInterval:    500 * time.Millisecond,
		MaxPayload:        1024,
		DeltaHeader:       20,
		MaxBytesPerSecond: 64 << 10,
		Churn:             1180,
		AnchorFraction:    DefaultAnchorFraction,
		Resident:          29206,
		MaxBlocksPerPeer:  1 << 16,
		HopLatency:        3 * time.Millisecond,
		RecordBytes:       207,
		PacketOverhead:    2 + 29,
		EntryBytes:        48,
		DistinctBytes:     112,
		Warmup:            10 * time.Second,
		Duration:          20 * time.Second,
		ProbeTimeout:      30 * time.Second,
		Probes:            200,
		Seed:              1,
	}
}

// meshRecordLoad is gossip's: the record transmissions a second memberlist carries a node.
const meshRecordLoad = 64

// MeshInterval is gossip.MeshInterval (TestMeshIntervalMatchesGossip keeps it so; the model
// imports no sockets): the interval of a node's records to the whole mesh of
// members, at least every: members × ceil(log10(members+1)) / 64 seconds.
func MeshInterval(every time.Duration, members int) time.Duration {
	if members <= 0 {
		return every
	}
	d := time.Duration(float64(time.Second) * float64(members) * math.Ceil(math.Log10(float64(members)+1)) / meshRecordLoad)
	return max(every, d)
}

// ErrConfig reports an invalid Config.
var ErrConfig = errors.New("scalemodel: invalid config")

func (c *Config) fill() error {
	d := DefaultConfig()
	orDefault(&c.Nodes, d.Nodes)
	orDefault(&c.Models, d.Models)
	orDefault(&c.GossipInterval, d.GossipInterval)
	orDefault(&c.GossipNodes, d.GossipNodes)
	orDefault(&c.RetransmitMult, d.RetransmitMult)
	orDefault(&c.PacketBytes, d.PacketBytes)
	orDefault(&c.PushPullInterval, d.PushPullInterval)
	orDefault(&c.PublishInterval, d.PublishInterval)
	orDefault(&c.StaleAfter, d.StaleAfter)
	orDefault(&c.PrefixInterval, d.PrefixInterval)
	orDefault(&c.MaxPayload, d.MaxPayload)
	orDefault(&c.DeltaHeader, d.DeltaHeader)
	orDefault(&c.MaxBytesPerSecond, d.MaxBytesPerSecond)
	orDefault(&c.AnchorFraction, d.AnchorFraction)
	orDefault(&c.Resident, d.Resident)
	orDefault(&c.MaxBlocksPerPeer, d.MaxBlocksPerPeer)
	orDefault(&c.RecordBytes, d.RecordBytes)
	orDefault(&c.EntryBytes, d.EntryBytes)
	orDefault(&c.DistinctBytes, d.DistinctBytes)
	orDefault(&c.Warmup, d.Warmup)
	orDefault(&c.Duration, d.Duration)
	orDefault(&c.ProbeTimeout, d.ProbeTimeout)
	orDefault(&c.Probes, d.Probes)
	if c.MeshPublishInterval == 0 {
		c.MeshPublishInterval = MeshInterval(c.PublishInterval, c.Nodes)
	}
	switch {
	case c.Nodes < 2:
		return fmt.Errorf("%w: %d nodes", ErrConfig, c.Nodes)
	case c.Models < 1 || c.Nodes/c.Models < 2:
		return fmt.Errorf("%w: %d models over %d nodes leave a domain under 2 nodes", ErrConfig, c.Models, c.Nodes)
	case c.Churn < 0 || c.HopLatency < 0 || c.PacketOverhead < 0 || c.DeltaHeader < 0 || c.ProbeGap < 0 || c.MeshPublishInterval < 0:
		return fmt.Errorf("%w: negative churn, hop latency, header, packet overhead, probe gap or mesh interval", ErrConfig)
	case c.AnchorFraction > 1:
		return fmt.Errorf("%w: anchor fraction %g over 1", ErrConfig, c.AnchorFraction)
	case c.RecordBytes+2 > c.PacketBytes:
		return fmt.Errorf("%w: a record larger than a packet", ErrConfig)
	case c.MaxPayload < c.DeltaHeader+8:
		return fmt.Errorf("%w: a %d-byte payload holds no block", ErrConfig, c.MaxPayload)
	}
	return nil
}

// orDefault sets a zero *v to def (the zero rule).
func orDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

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

type entry struct {
	m         *message
	transmits int
	ready     float64
	dead      bool
}

// queue is a node's TransmitLimitedQueue of records: tiers by transmissions, newest last in
// each.
type queue struct {
	tiers    [][]*entry
	live     int
	limit    int
	byOrigin map[int32]*entry // the queued record of each origin
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

// directEvery is gossip's directEveryLocked: a record straight to the domain's peers every
// PublishInterval, or as often as half the budget carries it to all of them.
func directEvery(c Config, peers int) time.Duration {
	d := time.Duration(float64(peers*(c.RecordBytes+c.PacketOverhead)) / (float64(c.MaxBytesPerSecond) / 2) * float64(time.Second))
	return max(c.PublishInterval, d)
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

// push adds e at the top of its tier.
func (q *queue) push(e *entry) {
	for len(q.tiers) <= e.transmits {
		q.tiers = append(q.tiers, nil)
	}
	q.tiers[e.transmits] = append(q.tiers[e.transmits], e)
	q.live++
}

// pushRecord queues a record, replacing its origin's older one.
func (q *queue) pushRecord(m *message, ready float64) {
	if old := q.byOrigin[m.origin]; old != nil {
		if old.m.seq >= m.seq {
			return
		}
		old.dead = true
		q.live--
	}
	e := &entry{m: m, ready: ready}
	q.byOrigin[m.origin] = e
	q.push(e)
}

// take removes and returns the messages that fit limit bytes (overhead each), fewest
// transmissions first, newest first in a tier, ready by now; each goes back a tier higher
// until it reaches the queue's limit.
func (q *queue) take(now float64, limit, overhead int) []*message {
	var out []*message
	var again []*entry
	used := 0
	for tier := 0; tier < len(q.tiers) && limit-used > overhead; tier++ {
		es := q.tiers[tier]
		for j := len(es) - 1; j >= 0 && limit-used > overhead; j-- {
			e := es[j]
			if e.dead {
				es = slices.Delete(es, j, j+1)
				continue
			}
			if e.ready > now || int(e.m.size)+overhead > limit-used {
				continue
			}
			es = slices.Delete(es, j, j+1)
			used += int(e.m.size) + overhead
			out = append(out, e.m)
			e.transmits++
			if e.transmits >= q.limit {
				q.live--
				q.forget(e)
			} else {
				again = append(again, e)
			}
		}
		q.tiers[tier] = es
	}
	for _, e := range again {
		q.live--
		q.push(e)
	}
	return out
}

// prune keeps the max least transmitted messages (newest first), as memberlist's Prune, and
// returns how many it dropped.
func (q *queue) prune(max int) int {
	dropped := 0
	for tier := len(q.tiers) - 1; tier >= 0 && q.live > max; tier-- {
		es := q.tiers[tier]
		n := 0
		for n < len(es) && q.live > max {
			if e := es[n]; !e.dead {
				q.live--
				dropped++
				q.forget(e)
			}
			n++
		}
		q.tiers[tier] = slices.Delete(es, 0, n)
	}
	return dropped
}

func (q *queue) forget(e *entry) {
	if q.byOrigin != nil && q.byOrigin[e.m.origin] == e {
		delete(q.byOrigin, e.m.origin)
	}
}
