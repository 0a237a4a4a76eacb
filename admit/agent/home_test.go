package agent

import (
	"slices"
	"testing"
	"time"
)

func newHome(t *testing.T, reg *Registry, mod func(*HomeConfig)) *Home {
	t.Helper()
	cfg := HomeConfig{Name: "h", Interval: 100 * time.Millisecond, LeaseIntervals: 5}
	if mod != nil {
		mod(&cfg)
	}
	h, err := NewHome(cfg, reg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestHomeDemotesOnlyWhatNoActiveAgentShares pins which blocks of a prefix the window gives
// up go first to eviction when its agent ends: those no active agent's prefix holds (a
// system prompt every agent shares stays).
func TestHomeDemotesOnlyWhatNoActiveAgentShares(t *testing.T) {
	tests := []struct {
		name     string
		active   map[string][]uint64
		released []uint64
		want     []uint64
	}{
		{"no active agent", nil, []uint64{1, 2, 3}, []uint64{1, 2, 3}},
		{"shared head kept", map[string][]uint64{"b": {1, 2, 7, 8}}, []uint64{1, 2, 3, 4}, []uint64{3, 4}},
		{"all shared", map[string][]uint64{"b": {1, 2}, "c": {3}}, []uint64{1, 2, 3}, nil},
		{"nothing to release", map[string][]uint64{"b": {1}}, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHome(t, newRegistry(t, window(8)), nil)
			now := time.Unix(1000, 0)
			for id, bs := range tt.active {
				if _, err := h.Arrive(now, id, 100); err != nil {
					t.Fatal(err)
				}
				if got := h.StepDone(now, id, 110, false, bs); got != nil {
					t.Fatalf("an active agent's step demoted %v", got)
				}
			}
			if _, err := h.Arrive(now, "a", 100); err != nil {
				t.Fatal(err)
			}
			got := h.StepDone(now, "a", 110, true, tt.released) // its last step
			if !slices.Equal(got, tt.want) {
				t.Fatalf("demoted %v, want %v", got, tt.want)
			}
		})
	}
}

// TestHomeLeaseOfAParkedStep pins the lease of a step parked at its ingress while its agent
// waits for the window: renewed, the agent keeps its place; unrenewed for LeaseIntervals, the
// home abandons it; given up, at once. A step parked at this node renews itself each Tick.
func TestHomeLeaseOfAParkedStep(t *testing.T) {
	now := time.Unix(1000, 0)
	setup := func(t *testing.T) *Home {
		h := newHome(t, newRegistry(t, func(c *Config) { c.Controller.InitialWindow, c.Controller.MaxWindow = 1, 1 }), nil)
		if d, _ := h.Arrive(now, "a", 100); d.Action != Admit {
			t.Fatalf("a: %v", d.Action)
		}
		if d, _ := h.Arrive(now, "b", 100); d.Action != Wait {
			t.Fatalf("b: %v, want wait (a holds the only slot)", d.Action)
		}
		return h
	}
	eng := Engine{KVBlocksTotal: 1000, KVBlocksUsed: 100, BlockTokens: 16}
	t.Run("renewed", func(t *testing.T) {
		h := setup(t)
		for i := 1; i <= 10; i++ {
			at := now.Add(time.Duration(i) * 100 * time.Millisecond)
			if st := h.Renew(at, "b"); st != Waiting {
				t.Fatalf("renewal %d: %v, want waiting", i, st)
			}
			h.Tick(at, eng, nil, nil)
		}
		if ls := h.LeaseStats(); ls.LeaseExpired != 0 {
			t.Fatalf("lease expired %d times while renewed", ls.LeaseExpired)
		}
	})
	t.Run("parked here", func(t *testing.T) {
		h := setup(t)
		for i := 1; i <= 10; i++ {
			h.Tick(now.Add(time.Duration(i)*100*time.Millisecond), eng, []string{"b"}, nil)
		}
		if _, ok := h.Registry().Get("b"); !ok || h.LeaseStats().LeaseExpired != 0 {
			t.Fatalf("a step parked here lost its agent's place: %+v", h.LeaseStats())
		}
	})
	t.Run("not renewed", func(t *testing.T) {
		h := setup(t)
		h.Tick(now.Add(400*time.Millisecond), eng, nil, nil)
		if h.LeaseStats().LeaseExpired != 0 {
			t.Fatal("abandoned within its lease")
		}
		h.Tick(now.Add(600*time.Millisecond), eng, nil, nil)
		if ls := h.LeaseStats(); ls.LeaseExpired != 1 {
			t.Fatalf("lease expired %d times, want 1", ls.LeaseExpired)
		}
		if _, ok := h.Registry().Get("b"); ok {
			t.Fatal("b still registered after its lease ran out")
		}
	})
	t.Run("given up", func(t *testing.T) {
		h := setup(t)
		h.GiveUp(now, "b")
		if ls := h.LeaseStats(); ls.GivenUp != 1 {
			t.Fatalf("given up %d, want 1", ls.GivenUp)
		}
	})
}

// TestHomeReleasesAnAgentAPreferredPeerKeeps: an agent registered at two homes stays only at
// the preferred one; the other releases it between steps and reports it, so its parked steps
// are routed again.
func TestHomeReleasesAnAgentAPreferredPeerKeeps(t *testing.T) {
	key := func(id string) uint64 { return uint64(len(id)) }
	for _, tt := range []struct {
		preferred string
		released  bool
	}{{"peer", true}, {"h", false}} {
		h := newHome(t, newRegistry(t, window(4)), func(c *HomeConfig) {
			c.Key = key
			c.Preferred = func(string, []string) string { return tt.preferred }
		})
		now := time.Unix(1000, 0)
		if _, err := h.Arrive(now, "ag", 100); err != nil {
			t.Fatal(err)
		}
		h.StepDone(now, "ag", 110, false, []uint64{5, 6})
		res := h.Tick(now, Engine{KVBlocksTotal: 1000, BlockTokens: 16}, nil, map[uint64][]string{key("ag"): {"peer"}})
		if got := slices.Contains(res.Released, "ag"); got != tt.released {
			t.Fatalf("preferred %s: released %v", tt.preferred, res.Released)
		}
		if tt.released && !slices.Equal(res.Demote, []uint64{5, 6}) {
			t.Fatalf("demoted %v, want the released agent's prefix", res.Demote)
		}
	}
}

// TestHomeSignals: U counts the idle active agents' prefixes the engine counts as free, and
// Next adds each active agent's growth.
func TestHomeSignals(t *testing.T) {
	h := newHome(t, newRegistry(t, window(4)), nil)
	now := time.Unix(1000, 0)
	for _, id := range []string{"a", "b"} {
		if _, err := h.Arrive(now, id, 100); err != nil {
			t.Fatal(err)
		}
	}
	h.StepDone(now, "a", 110, false, []uint64{1, 2, 3, 4})
	h.StepDone(now, "b", 110, false, []uint64{1, 2, 5, 6}) // shares 1 and 2 with a
	s := h.signals(Engine{KVBlocksTotal: 100, KVBlocksUsed: 10, BlockTokens: 16})
	if s.U != 0.16 { // 10 used + 6 distinct idle prefix blocks
		t.Fatalf("U = %v, want 0.16", s.U)
	}
	if s.Next < s.U {
		t.Fatalf("Next %v under U %v", s.Next, s.U)
	}
	if s := h.signals(Engine{}); s.U == s.U { // NaN: no engine state yet
		t.Fatalf("U = %v without engine state, want NaN", s.U)
	}
}
