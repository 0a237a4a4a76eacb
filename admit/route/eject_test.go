package route

import (
	"errors"
	"testing"
	"time"
)

// TestEjector walks one peer through sequences of forward results and checks, after each,
// how long a failure ejected it for and whether it is ejected.
func TestEjector(t *testing.T) {
	type step struct {
		at      time.Duration // since t0
		ok      bool          // a success; else a failure
		wantFor time.Duration // what Failure returned (0: no new ejection)
		ejected bool          // Ejected at the same instant, after the step
	}
	ms := time.Millisecond
	cfg := EjectConfig{Failures: 2, Backoff: 100 * ms, MaxBackoff: 350 * ms}
	tests := []struct {
		name  string
		cfg   EjectConfig
		steps []step
	}{
		{"one failure is not enough", cfg, []step{{at: 0}}},
		{"the second in a row ejects", cfg, []step{{at: 0}, {at: ms, wantFor: 100 * ms, ejected: true}}},
		{"a success in between resets", cfg, []step{{at: 0}, {at: ms, ok: true}, {at: 2 * ms}}},
		{"failures while ejected change nothing", cfg, []step{
			{at: 0}, {at: ms, wantFor: 100 * ms, ejected: true},
			{at: 50 * ms, ejected: true}, {at: 100 * ms, ejected: true},
		}},
		{"the ejection ends", cfg, []step{{at: 0}, {at: ms, wantFor: 100 * ms, ejected: true}, {at: 101 * ms, ok: true}}},
		{"a failure after it ejects again at once, for twice as long, up to the cap", cfg, []step{
			{at: 0}, {at: 0, wantFor: 100 * ms, ejected: true},
			{at: 100 * ms, wantFor: 200 * ms, ejected: true},
			{at: 300 * ms, wantFor: 350 * ms, ejected: true},
			{at: 650 * ms, wantFor: 350 * ms, ejected: true},
		}},
		{"a success after an ejection starts over", cfg, []step{
			{at: 0}, {at: 0, wantFor: 100 * ms, ejected: true},
			{at: 100 * ms, ok: true}, {at: 101 * ms}, {at: 102 * ms, wantFor: 100 * ms, ejected: true},
		}},
		{"failures far apart do not add up", cfg, []step{{at: 0}, {at: 400 * ms}, {at: 401 * ms, wantFor: 100 * ms, ejected: true}}},
		{"a single failure ejects at 1", EjectConfig{Failures: 1}, []step{{at: 0, wantFor: time.Second, ejected: true}}},
		{"negative failures never eject", EjectConfig{Failures: -1}, []step{{at: 0}, {at: 0}, {at: 0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := NewEjector(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tt.steps {
				now := t0.Add(s.at)
				var got time.Duration
				if s.ok {
					e.Success("p")
				} else {
					got = e.Failure(now, "p")
				}
				if got != s.wantFor {
					t.Fatalf("step %d: ejected for %v, want %v", i, got, s.wantFor)
				}
				if e.Ejected(now, "p") != s.ejected {
					t.Fatalf("step %d: ejected %v, want %v", i, !s.ejected, s.ejected)
				}
				if e.Ejected(now, "other") {
					t.Fatalf("step %d: another peer is ejected", i)
				}
			}
		})
	}
}

// TestEjectorSuccessSaysWhetherThePeerWasEjected: the node logs a peer's return only when it
// had been ejected, and Success forgets the peer either way.
func TestEjectorSuccessSaysWhetherThePeerWasEjected(t *testing.T) {
	e, err := NewEjector(EjectConfig{Failures: 1})
	if err != nil {
		t.Fatal(err)
	}
	if e.Success("p") {
		t.Error("a peer that never failed was ejected")
	}
	e.Failure(t0, "p")
	if !e.Success("p") || e.Success("p") {
		t.Error("Success after an ejection: want true once")
	}
}

// TestEjectorForgetsPeersThatStoppedFailing bounds its memory by the peers that failed
// lately, so peers that left the mesh do not accumulate.
func TestEjectorForgetsPeersThatStoppedFailing(t *testing.T) {
	e, err := NewEjector(EjectConfig{Failures: 3, MaxBackoff: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"a", "b", "c"} {
		e.Failure(t0, p)
	}
	e.Failure(t0.Add(time.Hour), "d")
	if n := len(e.peers); n != 1 {
		t.Fatalf("%d peers remembered, want 1", n)
	}
}

func TestEjectConfigValidation(t *testing.T) {
	for _, c := range []EjectConfig{
		{Backoff: -time.Second},
		{Backoff: time.Minute, MaxBackoff: time.Second},
	} {
		if _, err := NewEjector(c); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("NewEjector(%+v) = %v, want ErrInvalidConfig", c, err)
		}
		if _, err := New(Config{Eject: c}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New with eject %+v = %v, want ErrInvalidConfig", c, err)
		}
	}
}
