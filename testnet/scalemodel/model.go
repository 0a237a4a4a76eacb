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

// Config is one scenario: the mesh, kvmesh's gossip settings, the workload, the inputs to fit
// on measurements, and the run. Zero fields take DefaultConfig's values.
type Config struct {
	// Nodes is the mesh's size; Models splits it evenly into that many prefix domains, a
	// node serving one model (1: every node serves the same model).
	Nodes  int
	Models int

	// memberlist's settings, which carry the state records (gossip.Config's defaults).
	GossipInterval   time.Duration // memberlist's GossipInterval: 200 ms
	GossipNodes      int           // memberlist's GossipNodes: 3
	RetransmitMult   int           // 4
	PacketBytes      int           // a memberlist gossip packet's payload: 1,369 bytes
	PublishInterval  time.Duration // a record's period: 1 s
	StaleAfter       time.Duration // 3 s
	PushPullInterval time.Duration // 10 s, scaled as memberlist scales it above 32 members

	// kvmesh's prefix gossip: every PrefixInterval a node sends its pending anchor deltas to
	// each member of its domain, in packets of at most MaxPayload bytes (DeltaHeader of them
	// the delta's header), within MaxBytesPerSecond for everything it sends.
	PrefixInterval    time.Duration // 500 ms
	MaxPayload        int           // 1,024 bytes
	DeltaHeader       int           // envelope, origin, boot id, counts: 30 bytes
	MaxBytesPerSecond int           // 64 KiB/s

	// The workload: Churn blocks stored a second a node, and as many evicted (its pool is
	// full), AnchorFraction of them anchors; Resident blocks held by each engine,
	// MaxBlocksPerPeer the index's cap on a peer's entries.
	Churn            float64
	AnchorFraction   float64
	Resident         int
	MaxBlocksPerPeer int

	// Inputs to fit on the 16-, 32- and 64-node measurements.
	HopLatency     time.Duration // a send to the receiver's use of it: 1 ms
	RecordBytes    int           // a state record with its envelope: 330 bytes
	PacketOverhead int           // bytes a packet adds to its payload: AES-GCM 28, memberlist 1
	EntryBytes     float64       // the index's heap a (peer, block) entry: 48
	DistinctBytes  float64       // and a distinct hash: 112 (no block shared between peers)

	// The run: Warmup of simulated time, then Duration measured with Probes new prefixes;
	// a probe not visible ProbeTimeout after it was stored counts as not visible.
	Warmup, Duration, ProbeTimeout time.Duration
	Probes                         int
	Seed                           uint64
}

// DefaultConfig is kvmesh's defaults with the Mooncake conversation trace's per-node churn
// (1,180 blocks a second, testnet's BenchmarkScale) and anchor fraction on simulated H100
// pools (29,206 blocks).
func DefaultConfig() Config {
	return Config{
		Nodes:             128,
		Models:            1,
		GossipInterval:    200 * time.Millisecond,
		GossipNodes:       3,
		RetransmitMult:    4,
		PacketBytes:       1400 - 2 - 29,
		PublishInterval:   time.Second,
		StaleAfter:        3 * time.Second,
		PushPullInterval:  10 * time.Second,
		PrefixInterval:    500 * time.Millisecond,
		MaxPayload:        1024,
		DeltaHeader:       30,
		MaxBytesPerSecond: 64 << 10,
		Churn:             1180,
		AnchorFraction:    DefaultAnchorFraction,
		Resident:          29206,
		MaxBlocksPerPeer:  1 << 16,
		HopLatency:        time.Millisecond,
		RecordBytes:       330,
		PacketOverhead:    28 + 1,
		EntryBytes:        48,
		DistinctBytes:     112,
		Warmup:            10 * time.Second,
		Duration:          20 * time.Second,
		ProbeTimeout:      30 * time.Second,
		Probes:            200,
		Seed:              1,
	}
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
	orDefault(&c.PublishInterval, d.PublishInterval)
	orDefault(&c.StaleAfter, d.StaleAfter)
	orDefault(&c.PushPullInterval, d.PushPullInterval)
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
	switch {
	case c.Nodes < 2:
		return fmt.Errorf("%w: %d nodes", ErrConfig, c.Nodes)
	case c.Models < 1 || c.Nodes/c.Models < 2:
		return fmt.Errorf("%w: %d models over %d nodes leave a domain under 2 nodes", ErrConfig, c.Models, c.Nodes)
	case c.Churn < 0 || c.HopLatency < 0 || c.PacketOverhead < 0 || c.DeltaHeader < 0:
		return fmt.Errorf("%w: negative churn, hop latency, header or packet overhead", ErrConfig)
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

// Result is what a scenario predicts. Bytes are a node's a second. State bytes count a
// record and 2 (kvmesh_gossip_sent_bytes_total's rule); prefix bytes count each packet whole
// (its hashes, DeltaHeader and PacketOverhead), as the budget does. WireBytes is both with
// the record packets' overhead.
type Result struct {
	Nodes, Models, Domain      int
	RecordLimit                int // memberlist's transmissions of a record
	VisibleP50, VisibleP99     time.Duration
	Visible                    float64 // share of probes every domain member held in time
	RecordAgeP50, RecordAgeP99 time.Duration
	Stale                      float64 // share of sampled (viewer, origin) records past StaleAfter, or none yet
	StateBytes                 float64
	PrefixSent, PrefixReceived float64
	WireBytes                  float64
	PushPullBytes              float64 // snapshots and records over TCP, both directions
	// PrefixDemand is what a node's prefix sends would cost with no budget (every anchor
	// change to every domain peer, packed as one round packs them). Of the anchor changes,
	// Cancelled is the share that met their block's eviction while pending (both go), Dropped
	// the share dropped in a backlog over two seconds of budget (push/pull repairs them),
	// Waited the share sent a round or more late.
	PrefixDemand               float64
	Cancelled, Dropped, Waited float64
	// JoinBurst is what a node joining a domain receives at once: every member's anchored
	// snapshot, in packets.
	JoinBurst  float64
	IndexBytes float64 // the prefix index's heap a node, every domain peer at Resident
}

// RetransmitLimit is memberlist's: how many times a node sends one message of a queue whose
// NumNodes is n.
func RetransmitLimit(mult, n int) int { return mult * int(math.Ceil(math.Log10(float64(n+1)))) }

// backlogSeconds is how much budget a node's pending deltas may cost before they are dropped.
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
	carry            float64
	pending          []chunk
	probes           []int32 // its probes, which its snapshot carries
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

type sim struct {
	cfg     Config
	rng     *rand.Rand
	nodes   []node
	domains [][]int32
	ev      events
	// records: per viewer × origin, the newest seq held and when it was published
	recSeq  []int32
	recBorn []float32
	probes  []probe
	start   float64 // the measured window
	end     float64
	// measured
	stateBytes, wire, pushPullBytes float64
	changes, cancelled              float64
	dropped, waited                 float64
	ages                            []float64
	nextProbe                       int
}

func newSim(cfg Config) *sim {
	s := &sim{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))}
	n := cfg.Nodes
	s.nodes = make([]node, n)
	s.domains = make([][]int32, cfg.Models)
	recLimit := RetransmitLimit(cfg.RetransmitMult, n)
	for i := range s.nodes {
		d := i % cfg.Models
		s.nodes[i] = node{domain: d, local: len(s.domains[d]), tokens: float64(cfg.MaxBytesPerSecond)}
		s.domains[d] = append(s.domains[d], int32(i))
		s.nodes[i].records = queue{limit: recLimit, byOrigin: map[int32]*entry{}}
	}
	s.recSeq = make([]int32, n*n)
	s.recBorn = make([]float32, n*n)
	s.start = cfg.Warmup.Seconds()
	s.end = s.start + cfg.Duration.Seconds()
	for k := range cfg.Probes {
		s.probes = append(s.probes, probe{at: s.start + (float64(k)+0.5)*cfg.Duration.Seconds()/float64(cfg.Probes), origin: -1})
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
		for s.nextProbe < len(s.probes) && s.probes[s.nextProbe].at <= ev.t {
			s.store(s.nextProbe)
			s.nextProbe++
		}
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
			s.pushPull(int(ev.node), ev.t)
			ev.t += s.pushPullEvery()
		}
		s.ev.next(ev)
	}
}

func (s *sim) measuring(t float64) bool { return t >= s.start && t < s.end }

// store puts probe k's prefix on a random node: its anchors join the node's pending changes.
func (s *sim) store(k int) {
	p := &s.probes[k]
	p.origin = int32(s.rng.IntN(len(s.nodes)))
	nd := &s.nodes[p.origin]
	dom := s.domains[nd.domain]
	p.seen = make([]uint64, (len(dom)+63)/64)
	p.seen[nd.local/64] |= 1 << (nd.local % 64)
	nd.probes = append(nd.probes, int32(k))
	nd.pending = append(nd.pending, chunk{born: p.at, stores: probeAnchors, probe: int32(k)})
	if s.measuring(p.at) {
		s.changes += float64(probeAnchors)
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

// anchored is a snapshot's anchors: a peer's resident blocks that are anchors, within the
// index's cap.
func (s *sim) anchored() int {
	return min(int(math.Round(float64(s.cfg.Resident)*s.cfg.AnchorFraction)), s.cfg.MaxBlocksPerPeer)
}

// pushPull is memberlist's state exchange of node a with a random member of the mesh: each
// side takes the other's record and, inside one domain, its anchored residency (a snapshot
// from outside every domain is refused). Neither relays what it took.
func (s *sim) pushPull(a int, t float64) {
	b := s.rng.IntN(len(s.nodes) - 1)
	if b >= a {
		b++
	}
	at := t + s.cfg.HopLatency.Seconds()
	snapshot := float64(s.cfg.RecordBytes + 8*s.anchored())
	if s.measuring(t) {
		s.pushPullBytes += 2 * snapshot
	}
	for _, pair := range [2][2]int{{a, b}, {b, a}} {
		from, to := pair[0], pair[1]
		n := len(s.nodes)
		if seq := s.recSeq[from*n+from]; seq > s.recSeq[to*n+from] {
			s.recSeq[to*n+from], s.recBorn[to*n+from] = seq, s.recBorn[from*n+from]
		}
		if s.nodes[from].domain == s.nodes[to].domain {
			for _, k := range s.nodes[from].probes {
				s.deliver(to, int(k), at)
			}
		}
	}
}

func (s *sim) publish(i int, t float64) {
	nd := &s.nodes[i]
	nd.seq++
	m := &message{origin: int32(i), size: int32(s.cfg.RecordBytes), seq: nd.seq, born: t}
	n := len(s.nodes)
	s.recSeq[i*n+i], s.recBorn[i*n+i] = m.seq, float32(t)
	nd.records.pushRecord(m, t)
}

// refill adds the budget's tokens since the node's last send (a bucket of one second).
func (s *sim) refill(nd *node, t float64) {
	rate := float64(s.cfg.MaxBytesPerSecond)
	nd.tokens = min(rate, nd.tokens+rate*(t-nd.tokensAt))
	nd.tokensAt = t
}

// perPacket is how many hashes a packet holds.
func (s *sim) perPacket() int { return (s.cfg.MaxPayload - s.cfg.DeltaHeader) / 8 }

// cost is the bytes k hashes take to one peer: packets full but the last, each with its
// headers.
func (s *sim) cost(k int) int {
	if k == 0 {
		return 0
	}
	per := s.perPacket()
	packets := (k + per - 1) / per
	return 8*k + packets*(s.cfg.DeltaHeader+s.cfg.PacketOverhead)
}

// fits is the most hashes whose cost to one peer is within b bytes.
func (s *sim) fits(b int) int {
	if b <= 0 {
		return 0
	}
	per := s.perPacket()
	full := s.cost(per)
	k := b / full * per
	if rest := b%full - s.cfg.DeltaHeader - s.cfg.PacketOverhead; rest >= 8 {
		k += rest / 8
	}
	return k
}

// round is node i's prefix round: the interval's anchor changes join its pending ones (a store
// still pending when its block's eviction comes cancels with it), then what the budget's share
// allows goes, oldest first, to every other member of its domain; a backlog over two seconds
// of budget is dropped.
func (s *sim) round(i int, t float64) {
	c := &s.cfg
	nd := &s.nodes[i]
	s.refill(nd, t)
	nd.carry += c.Churn * c.AnchorFraction * c.PrefixInterval.Seconds()
	changes := int(nd.carry)
	nd.carry -= float64(changes)
	evicts := changes
	// An engine evicts a block about Resident/Churn seconds after storing it (its pool is full
	// and least recently used goes first).
	if c.Churn > 0 {
		lifetime := float64(c.Resident) / c.Churn
		for k := range nd.pending {
			ch := &nd.pending[k]
			if evicts == 0 || ch.born > t-lifetime {
				break
			}
			if ch.probe < 0 {
				n := min(ch.stores, evicts)
				ch.stores -= n
				evicts -= n
				if s.measuring(t) {
					s.cancelled += float64(2 * n)
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
	peers := len(s.domains[nd.domain]) - 1
	pending := 0
	for _, ch := range nd.pending {
		pending += ch.stores + ch.evicts
	}
	if pending == 0 || peers == 0 {
		nd.pending = nd.pending[:0]
		return
	}
	limit := min(float64(c.MaxBytesPerSecond)*c.PrefixInterval.Seconds(), nd.tokens)
	k := min(pending, s.fits(int(limit)/peers))
	bytes := float64(s.cost(k))
	nd.tokens -= bytes * float64(peers)
	at := t + c.HopLatency.Seconds()
	// Take k changes, oldest first; a probe is delivered with its last anchor.
	left, done := k, 0
	for ; done < len(nd.pending) && left > 0; done++ {
		ch := &nd.pending[done]
		took := min(left, ch.stores+ch.evicts)
		left -= took
		if s.measuring(t) && ch.born < t-c.PrefixInterval.Seconds() {
			s.waited += float64(took)
		}
		if took < ch.stores+ch.evicts {
			stores := min(took, ch.stores)
			ch.stores -= stores
			ch.evicts -= took - stores
			break
		}
		if ch.probe >= 0 {
			for _, to := range s.domains[nd.domain] {
				if int(to) != i {
					s.deliver(int(to), int(ch.probe), at)
				}
			}
		}
	}
	nd.pending = slices.Delete(nd.pending, 0, done)
	if s.measuring(t) {
		nd.sent += bytes * float64(peers)
		for _, to := range s.domains[nd.domain] {
			if int(to) != i {
				s.nodes[to].received += bytes
			}
		}
	}
	rest := pending - k
	if rest > 0 && float64(s.cost(rest)*peers) > backlogSeconds*float64(c.MaxBytesPerSecond) {
		if s.measuring(t) {
			s.dropped += float64(rest)
		}
		nd.pending = nd.pending[:0]
	}
}
func (s *sim) gossipRecords(i int, t float64) {
	nd := &s.nodes[i]
	s.refill(nd, t)
	// kvmesh prunes memberlist's queue to two seconds of budget, as it did for deltas.
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
			s.stateBytes += float64(bytes)
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

func (s *sim) deliverRecord(to int, m *message, at float64) {
	n := len(s.nodes)
	k := to*n + int(m.origin)
	if int(m.origin) == to || m.seq <= s.recSeq[k] {
		return
	}
	s.recSeq[k], s.recBorn[k] = m.seq, float32(m.born)
	s.nodes[to].records.pushRecord(m, at)
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
	}
}

func (s *sim) sampleAges(t float64) {
	n := len(s.nodes)
	for range min(2000, n*(n-1)) {
		v, o := s.rng.IntN(n), s.rng.IntN(n-1)
		if o >= v {
			o++
		}
		k := v*n + o
		if s.recSeq[k] == 0 {
			s.ages = append(s.ages, math.Inf(1))
			continue
		}
		s.ages = append(s.ages, t-float64(s.recBorn[k]))
	}
}

func (s *sim) result() Result {
	c := s.cfg
	dom := c.Nodes / c.Models
	r := Result{Nodes: c.Nodes, Models: c.Models, Domain: dom, RecordLimit: RetransmitLimit(c.RetransmitMult, c.Nodes)}
	per := float64(c.Nodes) * c.Duration.Seconds()
	var sent, received float64
	for _, nd := range s.nodes {
		sent += nd.sent
		received += nd.received
	}
	r.StateBytes, r.PrefixSent, r.PrefixReceived = s.stateBytes/per, sent/per, received/per
	r.WireBytes = (s.wire + sent) / per
	r.PushPullBytes = s.pushPullBytes / per
	if s.changes > 0 {
		r.Cancelled, r.Dropped, r.Waited = s.cancelled/s.changes, s.dropped/s.changes, s.waited/s.changes
	}
	perRound := 2 * c.Churn * c.AnchorFraction * c.PrefixInterval.Seconds()
	r.PrefixDemand = float64(dom-1) * float64(s.cost(int(math.Round(perRound)))) / c.PrefixInterval.Seconds()
	r.JoinBurst = float64(dom-1) * float64(s.cost(s.anchored()))
	var lat []float64
	for _, p := range s.probes {
		if p.visible {
			lat = append(lat, p.done-p.at)
		}
	}
	if len(s.probes) > 0 {
		r.Visible = float64(len(lat)) / float64(len(s.probes))
	}
	r.VisibleP50, r.VisibleP99 = quantile(lat, 0.5), quantile(lat, 0.99)
	r.RecordAgeP50, r.RecordAgeP99 = quantile(s.ages, 0.5), quantile(s.ages, 0.99)
	stale := 0
	for _, a := range s.ages {
		if a > c.StaleAfter.Seconds() {
			stale++
		}
	}
	if len(s.ages) > 0 {
		r.Stale = float64(stale) / float64(len(s.ages))
	}
	// Its peers and itself, no block shared: the bound.
	r.IndexBytes = float64(dom) * float64(s.anchored()) * (c.EntryBytes + c.DistinctBytes)
	return r
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
