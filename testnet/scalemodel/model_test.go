package scalemodel

import (
	"errors"
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
	c.Churn = 50
	if a, b := run(t, c), run(t, c); a != b {
		t.Fatalf("two runs of one seed differ:\n%+v\n%+v", a, b)
	}
}

// TestIdleMeshSeesEveryProbeQuickly pins the rule without load: every probe reaches every
// member in a few gossip rounds, every delta gets its transmissions, records stay fresh and
// the budget holds.
func TestIdleMeshSeesEveryProbeQuickly(t *testing.T) {
	c := small(16, 1)
	r := run(t, c)
	if r.Visible != 1 || r.VisibleP99 > 2*time.Second || r.VisibleP50 < c.GossipInterval {
		t.Errorf("visible %.2f, p50 %v, p99 %v", r.Visible, r.VisibleP50, r.VisibleP99)
	}
	if r.Stale != 0 || r.RecordAgeP99 > c.StaleAfter {
		t.Errorf("records: stale %.2f, p99 age %v", r.Stale, r.RecordAgeP99)
	}
	if r.Sends < float64(r.DeltaLimit)-1 {
		t.Errorf("a delta sent %.1f times, limit %d", r.Sends, r.DeltaLimit)
	}
	if total := r.StateBytes + r.PrefixBytes; total > 1.05*float64(c.MaxBytesPerSecond) {
		t.Errorf("%.0f B/s sent, budget %d", total, c.MaxBytesPerSecond)
	}
	if r.IndexBytes != 16*29206*(48+112) {
		t.Errorf("index %.0f bytes", r.IndexBytes)
	}
}

// TestDomainsCutPrefixCost pins that a node's prefix cost follows its domain, not the mesh:
// four models of 16 cost a node about a quarter of one model of 64.
func TestDomainsCutPrefixCost(t *testing.T) {
	one, four := run(t, small(64, 1)), run(t, small(64, 4))
	if four.Domain != 16 || four.PrefixBytes > 0.4*one.PrefixBytes {
		t.Errorf("prefix B/s: one model of 64 %.0f, four of %d %.0f", one.PrefixBytes, four.Domain, four.PrefixBytes)
	}
	if four.IndexBytes*4 != one.IndexBytes {
		t.Errorf("index: %.0f and %.0f", one.IndexBytes, four.IndexBytes)
	}
}

// TestChurnBeyondTheBudgetStarvesDeltas pins saturation: at the trace's churn the deltas'
// demand is far over the budget, so each gets a fraction of its transmissions and probes
// reach fewer members in time than without it.
func TestChurnBeyondTheBudgetStarvesDeltas(t *testing.T) {
	c := small(16, 1)
	idle := run(t, c)
	c.Churn = DefaultConfig().Churn
	busy := run(t, c)
	if busy.DeltaDemand < 10*float64(c.MaxBytesPerSecond) || busy.Sends > float64(busy.DeltaLimit)/2 {
		t.Errorf("demand %.0f B/s, %.1f sends of %d", busy.DeltaDemand, busy.Sends, busy.DeltaLimit)
	}
	if busy.Visible >= idle.Visible {
		t.Errorf("visible %.2f under churn, %.2f idle", busy.Visible, idle.Visible)
	}
}

func TestInvalidConfig(t *testing.T) {
	for _, c := range []Config{{Nodes: 1}, {Nodes: 10, Models: 6}, {Nodes: 10, Churn: -1}, {Nodes: 10, RecordBytes: 2000}} {
		if _, err := Run(c); !errors.Is(err, ErrConfig) {
			t.Errorf("Run(%+v) = %v, want ErrConfig", c, err)
		}
	}
}
