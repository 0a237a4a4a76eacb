package admit

import (
	"testing"
	"time"
)

// TestDrainMeter pins the dispatch rate Retry-After divides by: the tokens and requests
// dispatched in the last window (ten one-second buckets of a 10 s window), over the window or,
// on a fresh meter, over the time since its first dispatch (at least one bucket); an undone
// dispatch is taken back out.
func TestDrainMeter(t *testing.T) {
	m := drainMeter{window: 10 * time.Second}
	if tps, rps := m.rate(t0); tps != 0 || rps != 0 {
		t.Fatalf("fresh meter: %v %v, want 0 0", tps, rps)
	}
	m.add(t0, 500, 1)
	if tps, rps := m.rate(t0.Add(500 * time.Millisecond)); tps != 500 || rps != 1 {
		t.Fatalf("0.5 s after the first dispatch: %v %v, want one bucket's 500 1", tps, rps)
	}
	for i := 1; i < 10; i++ {
		m.add(t0.Add(time.Duration(i)*time.Second), 1000, 1)
	}
	// At t0+10s the window is (t0, t0+10s]: the nine dispatches after t0, over 10 s.
	if tps, rps := m.rate(t0.Add(10 * time.Second)); tps != 900 || rps != 0.9 {
		t.Fatalf("full window: %v %v, want 900 0.9", tps, rps)
	}
	m.undo(1000, 1)
	if tps, rps := m.rate(t0.Add(10 * time.Second)); tps != 800 || rps != 0.8 {
		t.Fatalf("after undo: %v %v, want 800 0.8", tps, rps)
	}
	if tps, rps := m.rate(t0.Add(time.Hour)); tps != 0 || rps != 0 {
		t.Fatalf("an hour later: %v %v, want 0 0", tps, rps)
	}
}
