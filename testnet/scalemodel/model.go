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

	// kvmesh's and memberlist's settings (gossip.Config's defaults).
	GossipInterval    time.Duration // memberlist's GossipInterval: 200 ms
	GossipNodes       int           // memberlist's GossipNodes: 3
	RetransmitMult    int           // 4
	PacketBytes       int           // a memberlist gossip packet's payload: 1,369 bytes
	MaxBytesPerSecond int           // the node's budget: 64 KiB/s
	MaxMessage        int           // a delta's largest message: 1,024 bytes
	FlushInterval     time.Duration // 50 ms
	PublishInterval   time.Duration // 1 s
	StaleAfter        time.Duration // 3 s
	PushPullInterval  time.Duration // 10 s, scaled as memberlist scales it above 32 members

	// The workload: Churn blocks stored a second a node, and as many evicted (its pool is
	// full); Resident blocks held by each engine, MaxBlocksPerPeer the index's cap.
	Churn            float64
	Resident         int
	MaxBlocksPerPeer int

	// Inputs to fit on the 16-, 32- and 64-node measurements.
	HopLatency     time.Duration // a send to the receiver's use of it: 1 ms
	RecordBytes    int           // a state record with its envelope: 330 bytes
	PacketOverhead int           // wire bytes a packet adds: IP and UDP 28, memberlist 1, AES-GCM 29
	EntryBytes     float64       // the index's heap a (peer, block) entry: 48
	DistinctBytes  float64       // and a distinct hash: 112 (no block shared between peers)

	// The run: Warmup of simulated time, then Duration measured with Probes new prefixes;
	// a probe not visible ProbeTimeout after it was stored counts as not visible.
	Warmup, Duration, ProbeTimeout time.Duration
	Probes                         int
	Seed                           uint64
}

// DefaultConfig is kvmesh's defaults with the Mooncake conversation trace's per-node churn
// (1,180 blocks a second, testnet's BenchmarkScale) on simulated H100 pools (29,206 blocks).
func DefaultConfig() Config {
	return Config{
		Nodes:             128,
		Models:            1,
		GossipInterval:    200 * time.Millisecond,
		GossipNodes:       3,
		RetransmitMult:    4,
		PacketBytes:       1400 - 2 - 29,
		MaxBytesPerSecond: 64 << 10,
		MaxMessage:        1024,
		FlushInterval:     50 * time.Millisecond,
		PublishInterval:   time.Second,
		StaleAfter:        3 * time.Second,
		PushPullInterval:  10 * time.Second,
		Churn:             1180,
		Resident:          29206,
		MaxBlocksPerPeer:  1 << 16,
		HopLatency:        time.Millisecond,
		RecordBytes:       330,
		PacketOverhead:    28 + 1 + 29,
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
	orDefault(&c.MaxBytesPerSecond, d.MaxBytesPerSecond)
	orDefault(&c.MaxMessage, d.MaxMessage)
	orDefault(&c.FlushInterval, d.FlushInterval)
	orDefault(&c.PublishInterval, d.PublishInterval)
	orDefault(&c.StaleAfter, d.StaleAfter)
	orDefault(&c.PushPullInterval, d.PushPullInterval)
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
	case c.Churn < 0 || c.HopLatency < 0 || c.PacketOverhead < 0:
		return fmt.Errorf("%w: negative churn, hop latency or packet overhead", ErrConfig)
	case c.RecordBytes+2 > c.PacketBytes || c.MaxMessage+2 > c.PacketBytes:
		return fmt.Errorf("%w: a record or a message larger than a packet", ErrConfig)
	case c.MaxMessage <= deltaHeader+8:
		return fmt.Errorf("%w: MaxMessage %d holds no block", ErrConfig, c.MaxMessage)
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

// Result is what a scenario predicts. Bytes are per node and second, as kvmesh counts them
// (kvmesh_gossip_sent_bytes_total: a message and 2 bytes); WireBytes adds each packet's
// overhead.
type Result struct {
	Nodes, Models, Domain      int
	RecordLimit, DeltaLimit    int // transmissions of a record, of a delta, per node
	VisibleP50, VisibleP99     time.Duration
	Visible                    float64 // share of probes every domain member held in time
	RecordAgeP50, RecordAgeP99 time.Duration
	Stale                      float64 // share of sampled (viewer, origin) records past StaleAfter, or none yet
	StateBytes, PrefixBytes    float64
	WireBytes                  float64
	PushPullBytes              float64 // snapshots and records over TCP, both directions
	// Sends is how many times a node sent a delta it queued, on average (DeltaLimit when
	// the budget allows every transmission; below it, the queue was pruned first), and
	// DeltaDemand the prefix bytes a node would send if every delta got DeltaLimit.
	Sends, DeltaDemand float64
	IndexBytes         float64 // the prefix index's heap a node, every domain peer at Resident
}

// The deltas' framing: kvmesh's envelope, origin and boot id and the summary's header take
// about this many bytes of a message; the rest holds 8 bytes a block.
const deltaHeader = 44

// RetransmitLimit is memberlist's: how many times a node sends one message of a queue whose
// NumNodes is n.
func RetransmitLimit(mult, n int) int { return mult * int(math.Ceil(math.Log10(float64(n+1)))) }

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
	probe  int32 // the probe it belongs to, or -1
	born   float64
	seen   []uint64 // deltas: the domain members holding it, by their index in the domain
}

type entry struct {
	m         *message
	transmits int
	ready     float64
	dead      bool
}

// queue is a node's TransmitLimitedQueue: tiers by transmissions, newest last in each.
type queue struct {
	tiers    [][]*entry
	live     int
	limit    int
	byOrigin map[int32]*entry // records: the queued record of each origin
}

type node struct {
	domain, local    int
	tokens, tokensAt float64
	records, deltas  queue
	seq              int32
	carry            float64
	pending          []int32    // probes stored since the last flush
	probed           []*message // its probes' messages, which its snapshot carries
}

type event struct {
	t    float64
	node int32
	kind uint8
}

const (
	evTick = iota
	evFlush
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
	at        float64
	need, got int
	done      float64
	messages  int
	origin    int32
	visible   bool
}

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
	stateBytes, prefixBytes, wire float64
	pushPullBytes                 float64
	queued, sends                 float64
	ages                          []float64
	nextProbe                     int
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
	for i := range s.nodes {
		s.nodes[i].deltas.limit = RetransmitLimit(cfg.RetransmitMult, len(s.domains[s.nodes[i].domain]))
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
		s.ev.next(event{t: s.rng.Float64() * cfg.FlushInterval.Seconds(), node: int32(i), kind: evFlush})
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
			p := &s.probes[s.nextProbe]
			p.origin = int32(s.rng.IntN(len(s.nodes)))
			nd := &s.nodes[p.origin]
			nd.pending = append(nd.pending, int32(s.nextProbe))
			s.nextProbe++
		}
		switch ev.kind {
		case evTick:
			s.tick(int(ev.node), ev.t)
			ev.t += s.cfg.GossipInterval.Seconds()
		case evFlush:
			s.flush(int(ev.node), ev.t)
			ev.t += s.cfg.FlushInterval.Seconds()
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

// pushPullEvery is memberlist's push/pull period: the interval, times ceil(log2(n/32))+1
// above 32 members.
func (s *sim) pushPullEvery() float64 {
	every := s.cfg.PushPullInterval.Seconds()
	if n := float64(len(s.nodes)); n > 32 {
		every *= math.Ceil(math.Log2(n)-5) + 1
	}
	return every
}

// pushPull is memberlist's state exchange of node a with a random member of the mesh: each
// side takes the other's record and, inside one domain, its full residency (a snapshot from
// outside every domain is refused). Neither relays what it took.
func (s *sim) pushPull(a int, t float64) {
	b := s.rng.IntN(len(s.nodes) - 1)
	if b >= a {
		b++
	}
	at := t + s.cfg.HopLatency.Seconds()
	snapshot := float64(s.cfg.RecordBytes + 8*min(s.cfg.Resident, s.cfg.MaxBlocksPerPeer))
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
			for _, m := range s.nodes[from].probed {
				s.deliverDelta(to, m, at, false)
			}
		}
	}
}

func (s *sim) publish(i int, t float64) {
	nd := &s.nodes[i]
	nd.seq++
	m := &message{origin: int32(i), size: int32(s.cfg.RecordBytes), seq: nd.seq, probe: -1, born: t}
	n := len(s.nodes)
	s.recSeq[i*n+i], s.recBorn[i*n+i] = m.seq, float32(t)
	nd.records.pushRecord(m, t)
}

func (s *sim) flush(i int, t float64) {
	nd := &s.nodes[i]
	per := (s.cfg.MaxMessage - deltaHeader) / 8
	nd.carry += 2 * s.cfg.Churn * s.cfg.FlushInterval.Seconds() // stored and evicted
	changes := int(nd.carry)
	nd.carry -= float64(changes)
	// A probe is a new prefix: with churn, the blocks this flush carries (the engine's new
	// prefixes are the churn), else 128 blocks of its own.
	for k, pi := range nd.pending {
		blocks := 128
		if k == 0 && changes > 0 {
			blocks, changes = changes, 0
		}
		p := &s.probes[pi]
		for blocks > 0 {
			k := min(per, blocks)
			blocks -= k
			p.messages++
			nd.probed = append(nd.probed, s.originate(i, t, int32(deltaHeader+8*k), pi))
		}
		p.need = p.messages * (len(s.domains[nd.domain]) - 1)
		if p.need == 0 {
			p.visible, p.done = true, p.at
		}
	}
	nd.pending = nd.pending[:0]
	for changes > 0 {
		k := min(per, changes)
		changes -= k
		s.originate(i, t, int32(deltaHeader+8*k), -1)
	}
	maxQueued := max(16, 2*s.cfg.MaxBytesPerSecond/s.cfg.MaxMessage)
	nd.records.prune(maxQueued)
	nd.deltas.prune(maxQueued)
}

// originate queues a new delta of node i.
func (s *sim) originate(i int, t float64, size, probe int32) *message {
	nd := &s.nodes[i]
	m := &message{origin: int32(i), size: size, probe: probe, born: t, seen: make([]uint64, (len(s.domains[nd.domain])+63)/64)}
	m.seen[nd.local/64] |= 1 << (nd.local % 64)
	nd.deltas.push(&entry{m: m, ready: t})
	if s.measuring(t) {
		s.queued++
	}
	return m
}

func (s *sim) tick(i int, t float64) {
	nd := &s.nodes[i]
	rate := float64(s.cfg.MaxBytesPerSecond)
	nd.tokens = min(rate, nd.tokens+rate*(t-nd.tokensAt))
	nd.tokensAt = t
	// memberlist's gossip and kvmesh's domain gossip tick independently; either may go first.
	if s.rng.IntN(2) == 0 {
		s.gossipRecords(i, t)
		s.gossipDeltas(i, t)
	} else {
		s.gossipDeltas(i, t)
		s.gossipRecords(i, t)
	}
}

func (s *sim) gossipRecords(i int, t float64) {
	nd := &s.nodes[i]
	if nd.records.live == 0 {
		return
	}
	n := len(s.nodes)
	var picked [8]int32
	targets := s.pick(picked[:0], int32(i), n, func(k int) int32 { return int32(k) })
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

func (s *sim) gossipDeltas(i int, t float64) {
	nd := &s.nodes[i]
	dom := s.domains[nd.domain]
	if nd.deltas.live == 0 || len(dom) < 2 {
		return
	}
	share := max(s.cfg.PacketBytes, int(float64(s.cfg.MaxBytesPerSecond)*s.cfg.GossipInterval.Seconds())/s.cfg.GossipNodes)
	var picked [8]int32
	targets := s.pick(picked[:0], int32(i), len(dom), func(k int) int32 { return dom[k] })
	for _, to := range targets {
		msgs := nd.deltas.take(t, min(share, int(nd.tokens)), 2)
		bytes := 0
		for _, m := range msgs {
			bytes += int(m.size) + 2
			s.deliverDelta(int(to), m, t+s.cfg.HopLatency.Seconds(), true)
		}
		nd.tokens -= float64(bytes)
		if s.measuring(t) {
			s.sends += float64(len(msgs))
			s.prefixBytes += float64(bytes)
			s.wire += float64(bytes + len(msgs)*s.cfg.PacketOverhead)
		}
	}
}

// pick appends up to GossipNodes distinct members other than self, drawn from n by at.
func (s *sim) pick(dst []int32, self int32, n int, at func(int) int32) []int32 {
	k := min(s.cfg.GossipNodes, n-1, cap(dst))
	for len(dst) < k {
		c := at(s.rng.IntN(n))
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

// deliverDelta hands m to node to at time at; relay queues it there (gossip, not push/pull).
func (s *sim) deliverDelta(to int, m *message, at float64, relay bool) {
	nd := &s.nodes[to]
	w, b := nd.local/64, uint64(1)<<(nd.local%64)
	if m.seen[w]&b != 0 {
		return
	}
	m.seen[w] |= b
	if relay {
		nd.deltas.push(&entry{m: m, ready: at})
		if s.measuring(at) {
			s.queued++
		}
	}
	if m.probe >= 0 {
		p := &s.probes[m.probe]
		p.got++
		if p.got == p.need && at-p.at <= s.cfg.ProbeTimeout.Seconds() {
			p.visible, p.done = true, at
		}
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
	r := Result{
		Nodes: c.Nodes, Models: c.Models, Domain: dom,
		RecordLimit: RetransmitLimit(c.RetransmitMult, c.Nodes), DeltaLimit: RetransmitLimit(c.RetransmitMult, dom),
	}
	per := float64(c.Nodes) * c.Duration.Seconds()
	r.StateBytes, r.PrefixBytes, r.WireBytes = s.stateBytes/per, s.prefixBytes/per, s.wire/per
	r.PushPullBytes = s.pushPullBytes / per
	if s.queued > 0 {
		r.Sends = s.sends / s.queued
	}
	// Every delta of the domain, held by every member, sent DeltaLimit times by each.
	per1 := (c.MaxMessage - deltaHeader) / 8
	perFlush := 2 * c.Churn * c.FlushInterval.Seconds()
	msgs := math.Ceil(perFlush / float64(per1))
	bytesPerFlush := perFlush*8 + msgs*(deltaHeader+2)
	r.DeltaDemand = float64(dom) * bytesPerFlush / c.FlushInterval.Seconds() * float64(r.DeltaLimit)
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
	blocks := float64(min(c.Resident, c.MaxBlocksPerPeer))
	r.IndexBytes = float64(dom) * blocks * (c.EntryBytes + c.DistinctBytes) // its peers and itself
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
