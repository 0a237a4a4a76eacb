package scalemodel

import (
	"errors"
	"fmt"
	"math"
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
