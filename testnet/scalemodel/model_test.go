package scalemodel

import (
	"errors"
	"math"
	"testing"
	"time"
)

// small is a quick scenario: n nodes, no churn, a few seconds.
func small(n, models int) Config {
	c := DefaultConfig()
	c.Nodes, c.Models, c.Churn = n, models, 0
	c.Warmup, c.Duration, c.Probes = 3*time.Second, 5*time.Second, 10
	return c
}

func run(t *testing.T, c Config) Result {
	t.Helper()
	r, err := Run(c)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRetransmitLimitIsMemberlists(t *testing.T) {
	for _, tc := range []struct{ n, want int }{{1, 4}, {9, 4}, {16, 8}, {64, 8}, {99, 8}, {100, 12}, {1000, 16}} {
		if got := RetransmitLimit(4, tc.n); got != tc.want {
			t.Errorf("RetransmitLimit(4, %d) = %d, want %d", tc.n, got, tc.want)
		}
	}
}

func TestRunIsDeterministic(t *testing.T) {
	c := small(32, 2)
	c.Churn = 500
	if a, b := run(t, c), run(t, c); a != b {
		t.Fatalf("two runs of one seed differ:\n%+v\n%+v", a, b)
	}
}

// TestMeshIntervalIsGossips pins the records' mesh-wide interval to gossip.MeshInterval's
// values (docs/design/gossip.md, "Records in a large mesh").
func TestMeshIntervalIsGossips(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want time.Duration
	}{{16, time.Second}, {32, time.Second}, {64, 2 * time.Second}, {128, 6 * time.Second}, {1000, 62500 * time.Millisecond}} {
		if got := MeshInterval(time.Second, tc.n); got != tc.want {
			t.Errorf("MeshInterval(1s, %d) = %v, want %v", tc.n, got, tc.want)
		}
	}
	if got := MeshInterval(5*time.Second, 64); got != 5*time.Second {
		t.Errorf("MeshInterval(5s, 64) = %v, want the publish interval", got)
	}
}

// TestUnderBudgetAProbeTakesOneRound pins direct sends: with the budget to spare, at no churn
// and at the trace's, every probe reaches every domain member within a prefix round and a
// hop, nothing waits or is dropped, and the budget holds.
func TestUnderBudgetAProbeTakesOneRound(t *testing.T) {
	for _, churn := range []float64{0, DefaultConfig().Churn} {
		c := small(32, 1)
		c.Churn = churn
		r := run(t, c)
		if r.Visible != 1 || r.VisibleP99 > c.PrefixInterval+c.HopLatency || r.VisibleP50 < c.HopLatency {
			t.Errorf("churn %.0f: visible %.2f, p50 %v, p99 %v", churn, r.Visible, r.VisibleP50, r.VisibleP99)
		}
		if r.Dropped != 0 || r.Waited != 0 {
			t.Errorf("churn %.0f: dropped %.3f, waited %.3f", churn, r.Dropped, r.Waited)
		}
		if r.Sent > float64(c.MaxBytesPerSecond) {
			t.Errorf("churn %.0f: %.0f B/s sent, budget %d", churn, r.Sent, c.MaxBytesPerSecond)
		}
	}
}

// TestPrefixBytesFollowDomainChurnAndAnchors pins the cost rule under the budget: a node sends
// each anchor change once to each domain peer, so its prefix bytes a second are
// (domain − 1) × (churn × 2 × anchor fraction × 8 bytes + a message's headers a round).
func TestPrefixBytesFollowDomainChurnAndAnchors(t *testing.T) {
	d := DefaultConfig()
	for _, tc := range []struct {
		models         int
		churn, anchors float64
	}{{1, d.Churn, d.AnchorFraction}, {2, d.Churn, d.AnchorFraction}, {1, d.Churn / 2, d.AnchorFraction}, {1, d.Churn, d.AnchorFraction / 2}} {
		c := small(64, tc.models)
		c.Churn, c.AnchorFraction, c.Probes = tc.churn, tc.anchors, 1
		r := run(t, c)
		hashes := 2 * c.Churn * c.AnchorFraction * 8 // stored and evicted
		rounds := 1 / c.PrefixInterval.Seconds()
		want := float64(64/tc.models-1) * (hashes + rounds*float64(c.DeltaHeader+c.PacketOverhead))
		if math.Abs(r.PrefixSent-want) > 0.03*want || math.Abs(r.PrefixDemand-want) > 0.03*want {
			t.Errorf("%+v: prefix sent %.0f B/s, demand %.0f, want %.0f", tc, r.PrefixSent, r.PrefixDemand, want)
		}
	}
	// The index: every domain peer's 449 anchors and the one probe's 8 anchors, held by the
	// other members of its domain, at 160 bytes an entry.
	c := small(64, 1)
	c.Probes = 1
	one := run(t, c)
	c.Models = 2
	two := run(t, c)
	if one.IndexBytes != (63*449+8*63/64.0)*160 || two.IndexBytes != (31*449+8*31/64.0)*160 {
		t.Errorf("index: %.0f in one domain, %.0f in two", one.IndexBytes, two.IndexBytes)
	}
}

// TestNoRelay pins that receivers do not pass deltas on: what a node receives is what its
// domain peers sent it, less each message's overhead, so with every node alike each receives
// about what it sends.
func TestNoRelay(t *testing.T) {
	c := small(48, 3)
	c.Churn, c.Probes = DefaultConfig().Churn, 1
	s := newSim(c)
	if err := s.cfg.fill(); err != nil {
		t.Fatal(err)
	}
	s.run()
	for i, nd := range s.nodes {
		if nd.sent == 0 || nd.received > nd.sent || nd.received < 0.8*nd.sent {
			t.Errorf("node %d sent %.0f bytes, received %.0f", i, nd.sent, nd.received)
		}
	}
}

// TestOverdraftKeepsTheAverageWithinBudget pins the overdraft: in one domain of 256 at the
// trace's churn each round goes whole and may overdraw the bucket, the next rounds wait, so
// probes are late and changes dropped, but what a node sends a second stays within the
// budget. With a budget too small for one round, every round is dropped and the domain
// resynced, still within it.
func TestOverdraftKeepsTheAverageWithinBudget(t *testing.T) {
	c := small(256, 1)
	c.Churn, c.Duration = DefaultConfig().Churn, 40*time.Second
	r := run(t, c)
	if r.PrefixDemand < float64(c.MaxBytesPerSecond) || r.Dropped == 0 {
		t.Errorf("demand %.0f B/s, dropped %.3f", r.PrefixDemand, r.Dropped)
	}
	if r.Sent > 1.05*float64(c.MaxBytesPerSecond) {
		t.Errorf("%.0f B/s sent, budget %d", r.Sent, c.MaxBytesPerSecond)
	}
	if r.Visible == 1 && r.VisibleP99 <= c.PrefixInterval+c.HopLatency {
		t.Errorf("every probe in a round: p99 %v", r.VisibleP99)
	}
	c = small(16, 1)
	// A round costs 15 × 196 bytes, over two seconds of 1 KiB/s; a residency of 31 anchors,
	// 300 bytes, is not.
	c.Churn, c.Resident, c.MaxBytesPerSecond = DefaultConfig().Churn, 2000, 1<<10
	r = run(t, c)
	if r.Dropped < 0.9 || r.Resyncs == 0 || r.Sent > 1.05*float64(c.MaxBytesPerSecond) {
		t.Errorf("budget %d: dropped %.3f, %.1f resyncs/s, %.0f B/s sent", c.MaxBytesPerSecond, r.Dropped, r.Resyncs, r.Sent)
	}
}

// TestDirectRecordsKeepDomainAgesFresh pins records by domain: past 32 nodes the mesh-wide
// interval is longer than PublishInterval, so records also go straight to the domain's
// members each PublishInterval, and in-domain ages stay within PublishInterval and a hop
// while the budget allows; a peer of another domain hears only through memberlist, every
// mesh interval, and is stale only past three of them.
func TestDirectRecordsKeepDomainAgesFresh(t *testing.T) {
	c := small(200, 10)
	r := run(t, c)
	if !r.DirectRecords || r.DirectRecordBytes == 0 || r.MeshInterval != MeshInterval(c.PublishInterval, 200) {
		t.Fatalf("direct records %v (%.0f B/s), mesh interval %v", r.DirectRecords, r.DirectRecordBytes, r.MeshInterval)
	}
	if r.InAgeP99 > c.PublishInterval+c.HopLatency || r.InStale != 0 {
		t.Errorf("in-domain ages: p99 %v, stale %.3f", r.InAgeP99, r.InStale)
	}
	if r.OutStaleAfter != 3*r.MeshInterval || r.OutAgeP50 <= c.StaleAfter || r.OutStale > 0.05 {
		t.Errorf("out-of-domain: stale after %v, ages p50 %v, stale %.3f", r.OutStaleAfter, r.OutAgeP50, r.OutStale)
	}
	// Up to 32 nodes nothing goes straight: one threshold, memberlist's records only.
	c = small(32, 2)
	if r := run(t, c); r.DirectRecords || r.DirectRecordBytes != 0 || r.OutStaleAfter != c.StaleAfter || r.InStale != 0 {
		t.Errorf("32 nodes: direct %v (%.0f B/s), out-of-domain stale after %v, in-domain stale %.3f",
			r.DirectRecords, r.DirectRecordBytes, r.OutStaleAfter, r.InStale)
	}
}

// TestMeshIntervalKeepsRecordsFresh pins why the mesh interval grows with the mesh: with every
// record through memberlist every second, 128 nodes find many stale; at the mesh interval
// (with direct records) none are.
func TestMeshIntervalKeepsRecordsFresh(t *testing.T) {
	c := small(128, 1)
	c.MeshPublishInterval = c.PublishInterval
	every, sized := run(t, c), run(t, small(128, 1))
	if every.InStale < 0.1 || sized.InStale != 0 {
		t.Errorf("stale records at 128 nodes: %.2f through memberlist every second, %.2f at the mesh interval", every.InStale, sized.InStale)
	}
}

// TestPendingStoresCoalesceWithTheirEvictions pins coalescing: a stored block still pending
// when its eviction comes (a small pool, deltas waiting on a tight budget) goes as one
// eviction.
func TestPendingStoresCoalesceWithTheirEvictions(t *testing.T) {
	c := small(16, 1)
	c.Churn, c.Resident = 20000, 10000 // 154 anchors stored a round, evicted a round later
	if r := run(t, c); r.Coalesced == 0 || r.Waited == 0 {
		t.Errorf("coalesced %.3f, waited %.3f", r.Coalesced, r.Waited)
	}
	c = small(32, 1)
	c.Churn = DefaultConfig().Churn
	if r := run(t, c); r.Coalesced != 0 {
		t.Errorf("coalesced %.3f with deltas sent every round", r.Coalesced)
	}
}

// TestJoinBurst pins what a joiner receives: every other domain member's anchored residency
// (449 anchors of 29,206 blocks, 4 messages), 3,796 bytes each, and its record, since 200
// nodes send records straight to their domain.
func TestJoinBurst(t *testing.T) {
	c := small(200, 2)
	c.Probes = 1
	if r := run(t, c); r.JoinBurst != 99*(449*8+4*(20+31)+207+31) {
		t.Errorf("join burst %.0f bytes", r.JoinBurst)
	}
}

func TestInvalidConfig(t *testing.T) {
	for _, c := range []Config{
		{Nodes: 1}, {Nodes: 10, Models: 6}, {Nodes: 10, Churn: -1}, {Nodes: 10, RecordBytes: 2000},
		{Nodes: 10, AnchorFraction: 2}, {Nodes: 10, MaxPayload: 20}, {Nodes: 10, ProbeGap: -1},
	} {
		if _, err := Run(c); !errors.Is(err, ErrConfig) {
			t.Errorf("Run(%+v) = %v, want ErrConfig", c, err)
		}
	}
}
