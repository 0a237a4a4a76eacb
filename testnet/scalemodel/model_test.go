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
		if total := r.StateBytes + r.PrefixSent; total > float64(c.MaxBytesPerSecond) {
			t.Errorf("churn %.0f: %.0f B/s sent, budget %d", churn, total, c.MaxBytesPerSecond)
		}
	}
}

// TestPrefixBytesFollowDomainChurnAndAnchors pins the cost rule under the budget: a node sends
// each anchor change once to each domain peer, so its prefix bytes a second are
// (domain − 1) × (churn × 2 × anchor fraction × 8 bytes + a packet's headers a round).
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
	one, two := run(t, small(64, 1)), run(t, small(64, 2))
	if two.IndexBytes*2 != one.IndexBytes || one.IndexBytes != 64*449*(48+112) {
		t.Errorf("index: %.0f in one domain, %.0f in two", one.IndexBytes, two.IndexBytes)
	}
}

// TestNoRelay pins that receivers do not pass deltas on: what a node receives is what its
// domain peers sent it, so with every node alike each receives what it sends.
func TestNoRelay(t *testing.T) {
	c := small(48, 3)
	c.Churn, c.Probes = DefaultConfig().Churn, 1
	s := newSim(c)
	if err := s.cfg.fill(); err != nil {
		t.Fatal(err)
	}
	s.run()
	for i, nd := range s.nodes {
		if nd.sent == 0 || math.Abs(nd.received-nd.sent) > 0.05*nd.sent {
			t.Errorf("node %d sent %.0f bytes, received %.0f", i, nd.sent, nd.received)
		}
	}
}

// TestOverBudgetDeltasWaitThenDrop pins saturation: in one domain of 256 at the trace's churn
// the demand is over the budget, so deltas wait and backlogs are dropped, sends stay within
// the budget, and probes are late.
func TestOverBudgetDeltasWaitThenDrop(t *testing.T) {
	c := small(256, 1)
	c.Churn = DefaultConfig().Churn
	r := run(t, c)
	if r.PrefixDemand < float64(c.MaxBytesPerSecond) || r.Dropped == 0 {
		t.Errorf("demand %.0f B/s, dropped %.3f", r.PrefixDemand, r.Dropped)
	}
	if total := r.StateBytes + r.PrefixSent; total > 1.02*float64(c.MaxBytesPerSecond) {
		t.Errorf("%.0f B/s sent, budget %d", total, c.MaxBytesPerSecond)
	}
	if r.Visible == 1 && r.VisibleP99 <= c.PrefixInterval+c.HopLatency {
		t.Errorf("every probe in a round: p99 %v", r.VisibleP99)
	}
}

// TestPendingStoresCancelWithTheirEvictions pins coalescing: a stored block still pending when
// its eviction comes (a small pool, deltas waiting on a tight budget) is sent neither way.
func TestPendingStoresCancelWithTheirEvictions(t *testing.T) {
	c := small(16, 1)
	c.Churn, c.Resident = 20000, 10000 // 154 anchors stored a round, evicted a round later
	if r := run(t, c); r.Cancelled == 0 || r.Waited == 0 {
		t.Errorf("cancelled %.3f, waited %.3f", r.Cancelled, r.Waited)
	}
	c = small(32, 1)
	c.Churn = DefaultConfig().Churn
	if r := run(t, c); r.Cancelled != 0 {
		t.Errorf("cancelled %.3f with deltas sent every round", r.Cancelled)
	}
}

// TestJoinBurst pins what a joiner receives: every other domain member's anchored snapshot
// (449 anchors of 29,206 blocks, 4 packets), 3,828 bytes each.
func TestJoinBurst(t *testing.T) {
	c := small(200, 2)
	c.Probes = 1
	if r := run(t, c); r.JoinBurst != 99*(449*8+4*59) {
		t.Errorf("join burst %.0f bytes", r.JoinBurst)
	}
}

// TestRecordsSaturateMemberlist pins what the prefix design leaves as it was: mesh-wide
// records, one packet a target a tick, go stale past a few dozen nodes.
func TestRecordsSaturateMemberlist(t *testing.T) {
	few, many := run(t, small(16, 1)), run(t, small(128, 1))
	if few.Stale != 0 || many.Stale < 0.2 {
		t.Errorf("stale records: %.2f at 16 nodes, %.2f at 128", few.Stale, many.Stale)
	}
}

func TestInvalidConfig(t *testing.T) {
	for _, c := range []Config{
		{Nodes: 1}, {Nodes: 10, Models: 6}, {Nodes: 10, Churn: -1}, {Nodes: 10, RecordBytes: 2000},
		{Nodes: 10, AnchorFraction: 2}, {Nodes: 10, MaxPayload: 20},
	} {
		if _, err := Run(c); !errors.Is(err, ErrConfig) {
			t.Errorf("Run(%+v) = %v, want ErrConfig", c, err)
		}
	}
}
