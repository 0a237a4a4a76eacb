package agent

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func newRegistry(t testing.TB, mod func(*Config)) *Registry {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Controller.CooldownTicks = -1
	if mod != nil {
		mod(&cfg)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return a
}

func window(n int) func(*Config) {
	return func(c *Config) { c.Controller.InitialWindow = n }
}

func arrive(t *testing.T, a *Registry, now time.Time, id, home string, want Action) Decision {
	t.Helper()
	d, err := a.Arrive(now, id, home, 100)
	if err != nil {
		t.Fatalf("Arrive(%s): %v", id, err)
	}
	if d.Action != want {
		t.Fatalf("Arrive(%s) = %v, want %v", id, d.Action, want)
	}
	return d
}

func state(t *testing.T, a *Registry, id string) State {
	t.Helper()
	ag, ok := a.Get(id)
	if !ok {
		return Absent
	}
	return ag.State
}

// shrink drives home's window down to n with thrashing samples.
func shrink(t *testing.T, a *Registry, now time.Time, home string, n int) {
	t.Helper()
	a.Tick(now, home, 0.95, 0.9)
	for h := 0.8; a.Window(home) > n; h -= 0.1 {
		if h < 0 {
			t.Fatalf("window stuck at %d, want %d", a.Window(home), n)
		}
		a.Tick(now, home, 0.95, h)
	}
	if a.Window(home) != n {
		t.Fatalf("window %d, want exactly %d (pick another n)", a.Window(home), n)
	}
}

func TestArriveAdmitsWithinWindow(t *testing.T) {
	a := newRegistry(t, window(2))
	d := arrive(t, a, t0, "a", "n1", Admit)
	if !d.New || d.Home != "n1" {
		t.Fatalf("first step: %+v", d)
	}
	arrive(t, a, t0, "b", "n1", Admit)
	if d := arrive(t, a, t0, "c", "n1", Wait); !d.New || d.Home != "n1" {
		t.Fatalf("third agent: %+v", d)
	}
	// Another home has its own window.
	arrive(t, a, t0, "d", "n2", Admit)
	// An active agent's next step is admitted and routed home whatever routing suggests.
	a.StepDone(t0, "a", 200)
	if d := arrive(t, a, t0.Add(time.Second), "a", "n2", Admit); d.New || d.Home != "n1" {
		t.Fatalf("active agent's next step: %+v", d)
	}
	// A second concurrent step of an active agent is part of the agent too.
	arrive(t, a, t0.Add(time.Second), "a", "", Admit)
	if ag, _ := a.Get("a"); !ag.InStep || ag.Steps != 1 || ag.ContextTokens != 100 {
		t.Fatalf("agent a: %+v", ag)
	}
	if got := a.Active("n1"); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("Active(n1) = %v", got)
	}
	if !a.CanStart("a") || a.CanStart("c") || a.CanStart("zz") {
		t.Fatal("CanStart disagrees with the window")
	}
	s := a.Stats()
	if s.Agents != 4 || s.Active != 3 || s.Waiting != 1 || s.InStep != 3 || s.AdmittedTotal != 3 {
		t.Fatalf("stats %+v", s)
	}
}

func TestArriveErrors(t *testing.T) {
	a := newRegistry(t, nil)
	if _, err := a.Arrive(t0, "", "n1", 1); !errors.Is(err, ErrInvalid) {
		t.Fatalf("empty id: %v", err)
	}
	if _, err := a.Arrive(t0, "a", "", 1); !errors.Is(err, ErrInvalid) {
		t.Fatalf("new agent without home: %v", err)
	}
	if a.StepDone(t0, "nobody", 1) != Absent || a.Finish(t0, "nobody") {
		t.Fatal("unknown agent reported as known")
	}
}

// TestPauseOnlyAtBoundary pins that a shrinking window never pauses an agent mid-step: the
// idle agents go first, the busy ones at their StepDone.
func TestPauseOnlyAtBoundary(t *testing.T) {
	a := newRegistry(t, window(4))
	for i, id := range []string{"a", "b", "c", "d"} {
		arrive(t, a, t0.Add(time.Duration(i)*time.Second), id, "n1", Admit)
	}
	// b and d finish their steps (d last); a and c stay mid-step.
	a.StepDone(t0.Add(5*time.Second), "b", 0)
	a.StepDone(t0.Add(6*time.Second), "d", 0)

	shrink(t, a, t0.Add(7*time.Second), "n1", 2) // 4 -> 2
	for id, want := range map[string]State{"a": Active, "b": Paused, "c": Active, "d": Paused} {
		if got := state(t, a, id); got != want {
			t.Fatalf("after shrink to 2: %s is %v, want %v", id, got, want)
		}
	}
	shrink(t, a, t0.Add(8*time.Second), "n1", 1)
	if state(t, a, "a") != Active || state(t, a, "c") != Active {
		t.Fatal("an agent mid-step was paused")
	}
	// c's step ends first: it is the one paused, at its boundary.
	if got := a.StepDone(t0.Add(9*time.Second), "c", 300); got != Paused {
		t.Fatalf("StepDone(c) = %v, want paused", got)
	}
	if got := a.StepDone(t0.Add(10*time.Second), "a", 300); got != Active {
		t.Fatalf("StepDone(a) = %v, want active (window 1 holds it)", got)
	}
	if s := a.Stats(); s.PausesTotal != 3 || s.Active != 1 || s.Paused != 3 {
		t.Fatalf("stats %+v", s)
	}
}

// TestPausedStepWaitsThenResumes pins that a paused agent's step waits (never fails) and is
// listed by Resumable once the window grows, after which Arrive admits it.
func TestPausedStepWaitsThenResumes(t *testing.T) {
	a := newRegistry(t, window(2))
	arrive(t, a, t0, "a", "n1", Admit)
	arrive(t, a, t0.Add(time.Second), "b", "n1", Admit)
	a.StepDone(t0.Add(2*time.Second), "a", 0)
	a.StepDone(t0.Add(3*time.Second), "b", 0)
	shrink(t, a, t0.Add(4*time.Second), "n1", 1)
	if state(t, a, "a") != Paused {
		t.Fatalf("a is %v, want paused (idle longest)", state(t, a, "a"))
	}
	d := arrive(t, a, t0.Add(5*time.Second), "a", "n2", Wait)
	if d.Home != "n1" {
		t.Fatalf("paused agent's home %q", d.Home)
	}
	if ag, _ := a.Get("a"); !ag.Pending || ag.PausedAt != t0.Add(4*time.Second) {
		t.Fatalf("paused agent: %+v", ag)
	}
	if got := a.Resumable(); len(got) != 0 {
		t.Fatalf("Resumable before room = %v", got)
	}
	a.Tick(t0.Add(6*time.Second), "n1", 0.5, 0.9) // 1 -> 2
	if got := a.Resumable(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("Resumable = %v, want [a]", got)
	}
	if got := a.Resumable(); len(got) != 0 {
		t.Fatalf("Resumable listed again: %v", got)
	}
	arrive(t, a, t0.Add(7*time.Second), "a", "", Admit)
	if s := a.Stats(); s.ResumesTotal != 1 || s.Paused != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestResumeOrder pins longest paused first, then new agents in arrival order, and that an
// agent without a held step resumes without being listed.
func TestResumeOrder(t *testing.T) {
	a := newRegistry(t, window(4))
	for i, id := range []string{"a", "b", "c", "d"} {
		arrive(t, a, t0.Add(time.Duration(i)*time.Second), id, "n1", Admit)
	}
	a.StepDone(t0.Add(10*time.Second), "c", 0)
	a.StepDone(t0.Add(11*time.Second), "a", 0)
	a.StepDone(t0.Add(12*time.Second), "b", 0)
	shrink(t, a, t0.Add(13*time.Second), "n1", 2) // pauses c then a (idle longest)
	a.StepDone(t0.Add(14*time.Second), "b", 0)    // stray boundary: nothing running, no change
	shrink(t, a, t0.Add(15*time.Second), "n1", 1) // pauses b
	for _, id := range []string{"c", "a", "b"} {
		if state(t, a, id) != Paused {
			t.Fatalf("%s is %v, want paused", id, state(t, a, id))
		}
	}
	// Steps arrive from b, c, then two new agents; a stays in its tool call.
	arrive(t, a, t0.Add(16*time.Second), "b", "n1", Wait)
	arrive(t, a, t0.Add(17*time.Second), "c", "n1", Wait)
	arrive(t, a, t0.Add(18*time.Second), "e", "n1", Wait)
	arrive(t, a, t0.Add(19*time.Second), "f", "n1", Wait)

	var order []string
	for i := 0; len(order) < 4 && i < 10; i++ {
		a.Tick(t0.Add(time.Duration(20+i)*time.Second), "n1", 0.5, 0.9) // +1 per tick
		order = append(order, a.Resumable()...)
	}
	if want := []string{"c", "b", "e", "f"}; !slices.Equal(order, want) {
		t.Fatalf("release order %v, want %v", order, want)
	}
	if state(t, a, "a") != Active {
		t.Fatalf("a (paused before b) is %v, want resumed", state(t, a, "a"))
	}
}

func TestFinishGivesRoom(t *testing.T) {
	a := newRegistry(t, window(1))
	arrive(t, a, t0, "a", "n1", Admit)
	arrive(t, a, t0, "b", "n1", Wait)
	if !a.Finish(t0, "a") {
		t.Fatal("Finish(a) = false")
	}
	if got := a.Resumable(); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("Resumable = %v", got)
	}
	if a.Stats().FinishedTotal != 1 {
		t.Fatal("finish not counted")
	}
}

// handedOver checks that gone left the registry and that its slot went to next, the only
// agent Resumable lists.
func handedOver(t *testing.T, a *Registry, gone, next string) {
	t.Helper()
	if _, ok := a.Get(gone); ok {
		t.Fatalf("%s still registered", gone)
	}
	if state(t, a, next) != Active {
		t.Fatalf("%s is %v, want active in %s's slot", next, state(t, a, next), gone)
	}
	if got := a.Resumable(); !slices.Equal(got, []string{next}) {
		t.Fatalf("Resumable = %v, want only %s", got, next)
	}
}

// TestRelease pins that an agent another home keeps leaves this one, unless it is mid-step,
// and that its slot goes to the next agent.
func TestRelease(t *testing.T) {
	a := newRegistry(t, window(1))
	arrive(t, a, t0, "a", "n1", Admit)
	arrive(t, a, t0, "b", "n1", Wait)
	if a.Release(t0, "a") {
		t.Fatal("released an agent mid-step")
	}
	if state(t, a, "a") != Active {
		t.Fatalf("a is %v after a refused Release, want active", state(t, a, "a"))
	}
	a.StepDone(t0, "a", 0)
	if !a.Release(t0, "a") {
		t.Fatal("did not release an idle agent")
	}
	handedOver(t, a, "a", "b")
	arrive(t, a, t0, "c", "n1", Wait)
	if !a.Release(t0, "c") { // waiting, its step held: released all the same
		t.Fatal("did not release a waiting agent")
	}
	if a.Release(t0, "c") || a.Release(t0, "nobody") {
		t.Fatal("released an unknown agent")
	}
	if got := a.Stats().ReleasedTotal; got != 2 {
		t.Fatalf("ReleasedTotal = %d, want 2", got)
	}
}

// TestLeavingAtPredictedOverflowShrinksTheWindow pins the decrease by attrition at the
// Registry: an agent that finishes while its home's predicted KV use is at or above HighU
// takes its slot with it, so the waiting agent stays waiting and nobody is paused; under HighU,
// or under it once the leaver's context (and a step's growth) is taken off the prediction,
// its slot goes to the waiting agent.
func TestLeavingAtPredictedOverflowShrinksTheWindow(t *testing.T) {
	tests := []struct {
		name       string
		next       float64
		pool, ctx  int // the pool's size and the leaver's context, tokens (0: unknown)
		wantWindow int
		wantC      State
	}{
		{"predicted overflow", 0.95, 0, 0, 1, Waiting},
		{"no overflow predicted", 0.85, 0, 0, 2, Active},
		{"the leaver takes the overflow along", 0.95, 1000, 300, 2, Active}, // 0.95 - 0.3
		{"a small leaver leaves it", 0.95, 1000, 20, 1, Waiting},            // 0.95 - 0.02
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newRegistry(t, func(c *Config) { c.Controller.InitialWindow, c.Controller.SlowStartSteps = 2, -1 })
			arrive(t, a, t0, "a", "n1", Admit)
			arrive(t, a, t0, "b", "n1", Admit)
			arrive(t, a, t0, "c", "n1", Wait)
			a.StepDone(t0, "a", tt.ctx)
			a.StepDone(t0, "b", 0)
			a.TickSignals(t0, "n1", Signals{U: 0.5, Next: tt.next, H: 0.9, PoolTokens: tt.pool})
			a.Finish(t0, "a")
			if got := a.Window("n1"); got != tt.wantWindow {
				t.Errorf("window %d after a finished, want %d", got, tt.wantWindow)
			}
			if got := state(t, a, "c"); got != tt.wantC {
				t.Errorf("c is %v, want %v", got, tt.wantC)
			}
			if got := state(t, a, "b"); got != Active {
				t.Errorf("b is %v, want active: attrition pauses no one", got)
			}
		})
	}
}

func TestAbandon(t *testing.T) {
	a := newRegistry(t, window(1))
	arrive(t, a, t0, "a", "n1", Admit)
	arrive(t, a, t0, "b", "n1", Wait)
	if !a.Abandon(t0, "b") { // new agent whose held step expired: it leaves
		t.Error("Abandon of a waiting agent reported that it stayed")
	}
	if _, ok := a.Get("b"); ok {
		t.Fatal("abandoned new agent still registered")
	}
	a.StepDone(t0, "a", 0)
	a.Tick(t0, "n1", 0.95, 0.9)
	arrive(t, a, t0, "c", "n1", Wait)
	a.Finish(t0, "a")
	arrive(t, a, t0, "d", "n1", Wait)
	a.Abandon(t0, "c") // promoted but its step went away before the node took it: the slot is d's
	handedOver(t, a, "c", "d")
	arrive(t, a, t0, "d", "", Admit)
	if a.Abandon(t0, "d") { // a stray abandon of an agent active on its own account changes nothing
		t.Error("Abandon of an agent active on its own account reported that it left")
	}
	if state(t, a, "d") != Active {
		t.Fatalf("d is %v after a stray Abandon, want active", state(t, a, "d"))
	}
	// A paused agent whose held step is abandoned leaves too, so it is not resumed into a slot.
	b := newRegistry(t, window(2))
	arrive(t, b, t0, "p", "n1", Admit)
	b.StepDone(t0, "p", 0)
	arrive(t, b, t0, "q", "n1", Admit)
	b.StepDone(t0, "q", 0)
	b.Tick(t0, "n1", 0.95, 0.1) // 2*0.7 = 1: the idle-longest (p) is paused
	if state(t, b, "p") != Paused {
		t.Fatalf("p is %v, want paused", state(t, b, "p"))
	}
	arrive(t, b, t0, "p", "", Wait)
	b.Abandon(t0, "p")
	if _, ok := b.Get("p"); ok {
		t.Fatal("a paused agent whose step was abandoned stays registered")
	}
}

func TestSweep(t *testing.T) {
	a := newRegistry(t, func(c *Config) {
		c.Controller.InitialWindow = 2
		c.IdleTimeout = time.Minute
		c.StepTimeout = 10 * time.Minute
	})
	arrive(t, a, t0, "idle", "n1", Admit)
	a.StepDone(t0, "idle", 0)
	arrive(t, a, t0, "busy", "n1", Admit)                    // mid-step: not idle
	arrive(t, a, t0.Add(30*time.Second), "late", "n1", Wait) // waiting its turn
	arrive(t, a, t0.Add(50*time.Second), "fresh", "n2", Admit)
	a.StepDone(t0.Add(50*time.Second), "fresh", 0)

	if got := a.Sweep(t0.Add(time.Minute)); len(got) != 0 {
		t.Fatalf("swept at exactly the timeout: %v", got)
	}
	got := a.Sweep(t0.Add(61 * time.Second))
	if !slices.Equal(got, []string{"idle"}) {
		t.Fatalf("swept %v, want [idle]", got)
	}
	// idle's slot went to late.
	if r := a.Resumable(); !slices.Equal(r, []string{"late"}) {
		t.Fatalf("Resumable after sweep = %v", r)
	}
	got = a.Sweep(t0.Add(10*time.Minute + time.Second))
	slices.Sort(got)
	if !slices.Equal(got, []string{"busy", "fresh", "late"}) {
		t.Fatalf("swept %v, want busy (lost boundary), fresh, late", got)
	}
	if s := a.Stats(); s.Agents != 0 || s.SweptTotal != 4 || s.InStep != 0 {
		t.Fatalf("stats %+v", s)
	}
	if got := a.ForgetHome(t0, "n2"); len(got) != 0 {
		t.Fatalf("ForgetHome of an empty home removed %v", got)
	}
	if got := a.ForgetHome(t0, "n2"); got != nil {
		t.Fatalf("ForgetHome twice: %v", got)
	}
}

func TestRegistryBound(t *testing.T) {
	a := newRegistry(t, func(c *Config) { c.MaxAgents = 3; c.Controller.InitialWindow = 2 })
	arrive(t, a, t0, "a", "n1", Admit)
	a.StepDone(t0.Add(1*time.Second), "a", 0)
	arrive(t, a, t0.Add(2*time.Second), "b", "n1", Admit) // stays mid-step
	arrive(t, a, t0.Add(3*time.Second), "c", "n1", Wait)
	// Full: the idle-longest agent not mid-step (a) leaves, its slot goes to c.
	d := arrive(t, a, t0.Add(4*time.Second), "d", "n1", Wait)
	if d.Evicted != "a" {
		t.Fatalf("evicted %q, want a", d.Evicted)
	}
	if state(t, a, "c") != Active {
		t.Fatalf("c is %v, want active in a's slot", state(t, a, "c"))
	}
	arrive(t, a, t0.Add(5*time.Second), "c", "", Admit) // c's held step runs
	// Now b and c are mid-step; d is the only candidate.
	if d := arrive(t, a, t0.Add(6*time.Second), "e", "n1", Wait); d.Evicted != "d" {
		t.Fatalf("evicted %q, want d", d.Evicted)
	}
	arrive(t, a, t0.Add(7*time.Second), "e", "", Wait)
	a.Abandon(t0, "e")
	arrive(t, a, t0.Add(8*time.Second), "f", "n1", Wait) // room again without eviction
	if _, err := a.Arrive(t0.Add(9*time.Second), "g", "n1", 1); err != nil {
		t.Fatalf("f not mid-step, so g should evict it: %v", err)
	}
	a.Abandon(t0, "g")
	arrive(t, a, t0.Add(10*time.Second), "h", "n1", Wait)
	if s := a.Stats(); s.Agents != 3 || s.EvictedTotal != 3 {
		t.Fatalf("stats %+v", s)
	}
	// Everyone mid-step: a newcomer is refused.
	a2 := newRegistry(t, func(c *Config) { c.MaxAgents = 2 })
	arrive(t, a2, t0, "a", "n1", Admit)
	arrive(t, a2, t0, "b", "n1", Admit)
	if _, err := a2.Arrive(t0, "c", "n1", 1); !errors.Is(err, ErrFull) {
		t.Fatalf("full of busy agents: %v, want ErrFull", err)
	}
}

func TestObserve(t *testing.T) {
	a := newRegistry(t, nil)
	arrive(t, a, t0, "a", "n1", Admit)
	tests := []struct {
		name                  string
		cached, prompt        int
		stepEnd               int // context at the step's end; 0: no StepDone
		wantAvoid, wantRecomp int
	}{
		{"first step computes, nothing to reuse", 0, 100, 150, 0, 0},
		{"full reuse", 150, 180, 250, 150, 0},
		{"evicted prefix recomputed", 50, 300, 400, 50, 200},
		{"cached beyond prompt clamped", 900, 400, 0, 400, 0},
		{"negative cached", -5, 400, 0, 0, 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			av, rc := a.Observe("a", tt.cached, tt.prompt)
			if av != tt.wantAvoid || rc != tt.wantRecomp {
				t.Fatalf("Observe = %d, %d; want %d, %d", av, rc, tt.wantAvoid, tt.wantRecomp)
			}
			if tt.stepEnd > 0 {
				a.StepDone(t0, "a", tt.stepEnd)
				arrive(t, a, t0, "a", "", Admit)
			}
		})
	}
	if s := a.Stats(); s.RecomputeAvoidedTokens != 600 || s.RecomputedTokens != 600 {
		t.Fatalf("stats avoided %d recomputed %d", s.RecomputeAvoidedTokens, s.RecomputedTokens)
	}
	if av, rc := a.Observe("nobody", 10, 10); av != 0 || rc != 0 {
		t.Fatal("unknown agent counted")
	}
}

func TestStatsHomes(t *testing.T) {
	a := newRegistry(t, window(1))
	arrive(t, a, t0, "a", "n2", Admit)
	arrive(t, a, t0, "b", "n1", Admit)
	arrive(t, a, t0, "c", "n1", Wait)
	a.Tick(t0, "n1", 0.5, 0.7)
	s := a.Stats()
	if len(s.Homes) != 2 || s.Homes[0].Home != "n1" || s.Homes[1].Home != "n2" {
		t.Fatalf("homes %+v", s.Homes)
	}
	n1 := s.Homes[0]
	if n1.Controller.Window != 2 || n1.Controller.U != 0.5 || n1.Controller.H != 0.7 || n1.Active != 2 {
		t.Fatalf("n1 %+v", n1)
	}
	if a.Window("n1") != 2 || a.Window("unknown") != 1 {
		t.Fatal("Window disagrees with stats")
	}
}

func TestForgetHome(t *testing.T) {
	a := newRegistry(t, window(1))
	arrive(t, a, t0, "a", "gone", Admit)
	arrive(t, a, t0, "b", "gone", Wait)
	arrive(t, a, t0, "c", "kept", Admit)
	got := a.ForgetHome(t0, "gone")
	slices.Sort(got)
	if !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("ForgetHome = %v", got)
	}
	if s := a.Stats(); s.Agents != 1 || len(s.Homes) != 1 || s.InStep != 1 || len(a.Resumable()) != 0 {
		t.Fatalf("stats after ForgetHome %+v", s)
	}
	// a comes back as a new agent, routed to a live node.
	if d := arrive(t, a, t0, "a", "kept", Wait); !d.New || d.Home != "kept" {
		t.Fatalf("returning agent %+v", d)
	}
}

// TestZeroConfigIsTheDefault pins the zero rule: every zero field takes its default, and
// filling keeps the explicit negative values that turn settings off.
func TestZeroConfigIsTheDefault(t *testing.T) {
	a, err := New(Config{})
	if err != nil {
		t.Fatalf("New(Config{}): %v", err)
	}
	if a.cfg != DefaultConfig() {
		t.Errorf("New(Config{}) filled %+v, want %+v", a.cfg, DefaultConfig())
	}
	c := Config{Controller: ControllerConfig{MaxWindow: 4, TargetU: 0.95, CooldownTicks: -1, SlowStartSteps: -1, HitFloor: -1, HitMargin: -1}}
	if err := c.fill(); err != nil {
		t.Fatal(err)
	}
	cc := c.Controller
	if cc.InitialWindow != 4 || cc.HighU != 0.95 || cc.MinWindow != 1 || cc.CooldownTicks != -1 || cc.SlowStartSteps != -1 || cc.HitFloor != -1 || cc.HitMargin != -1 {
		t.Errorf("filled controller %+v: want the initial window cut to the max, high u raised to target u, negatives kept", cc)
	}
	again := c
	if err := again.fill(); err != nil || again != c {
		t.Errorf("filling twice changed %+v to %+v (%v)", c, again, err)
	}
}

func TestConfigValidation(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
	}{
		{"max agents", func(c *Config) { c.MaxAgents = -1 }},
		{"idle timeout", func(c *Config) { c.IdleTimeout = -time.Second }},
		{"step timeout", func(c *Config) { c.StepTimeout = -1 }},
		{"controller", func(c *Config) { c.Controller.Beta = 2 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tt.mod(&cfg)
			if _, err := New(cfg); !errors.Is(err, ErrConfig) {
				t.Fatalf("New: %v, want ErrConfig", err)
			}
		})
	}
}

// TestInvariantsRandom runs random operations and checks, after each, that the bookkeeping
// agrees with itself and that no home is over its window with an idle active agent, or under
// it with anyone paused or waiting.
func TestInvariantsRandom(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 7))
			a := newRegistry(t, func(c *Config) {
				c.MaxAgents = 30
				c.Controller.InitialWindow = 4
				c.Controller.MaxWindow = 12
				c.IdleTimeout = 20 * time.Second
				c.StepTimeout = 60 * time.Second
			})
			homes := []string{"n1", "n2", "n3"}
			now := t0
			for op := range 3000 {
				now = now.Add(time.Duration(r.IntN(1000)) * time.Millisecond)
				id := fmt.Sprintf("g%d", r.IntN(40))
				switch k := r.IntN(100); {
				case k < 40:
					_, err := a.Arrive(now, id, homes[r.IntN(3)], r.IntN(5000))
					if err != nil && !errors.Is(err, ErrFull) {
						t.Fatalf("op %d: %v", op, err)
					}
				case k < 75:
					a.StepDone(now, id, r.IntN(5000))
				case k < 85:
					a.Tick(now, homes[r.IntN(3)], r.Float64(), r.Float64())
				case k < 88:
					a.Finish(now, id)
				case k < 91:
					a.Abandon(now, id)
				case k < 94:
					a.Sweep(now)
				case k < 95:
					a.ForgetHome(now, homes[r.IntN(3)])
				default:
					for _, rid := range a.Resumable() {
						if !a.CanStart(rid) {
							t.Fatalf("op %d: Resumable listed %s which cannot start", op, rid)
						}
					}
				}
				checkInvariants(t, a, op)
			}
		})
	}
}

func checkInvariants(t *testing.T, a *Registry, op int) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.lru.Len() != len(a.agents) || len(a.agents) > a.cfg.MaxAgents {
		t.Fatalf("op %d: lru %d agents %d", op, a.lru.Len(), len(a.agents))
	}
	inStep := 0
	count := map[string]map[State]int{}
	for id, e := range a.agents {
		if e.ID != id || e.InStep != (e.inflight > 0) {
			t.Fatalf("op %d: entry %s inconsistent: %+v", op, id, e.Agent)
		}
		if e.InStep {
			inStep++
		}
		if e.InStep && e.State != Active {
			t.Fatalf("op %d: %s mid-step while %v", op, id, e.State)
		}
		if count[e.Home] == nil {
			count[e.Home] = map[State]int{}
		}
		count[e.Home][e.State]++
	}
	if inStep != a.inStep {
		t.Fatalf("op %d: inStep %d, counted %d", op, a.inStep, inStep)
	}
	for name, h := range a.homes {
		c := count[name]
		if h.active.Len() != c[Active] || h.paused.Len() != c[Paused] || h.waiting.Len() != c[Waiting] {
			t.Fatalf("op %d: home %s lists %d/%d/%d, agents say %v", op, name,
				h.active.Len(), h.paused.Len(), h.waiting.Len(), c)
		}
		w := h.ctl.Window()
		if h.active.Len() < w && h.paused.Len()+h.waiting.Len() > 0 {
			t.Fatalf("op %d: home %s has room (%d < %d) while agents wait", op, name, h.active.Len(), w)
		}
		if h.active.Len() > w {
			for el := h.active.Front(); el != nil; el = el.Next() {
				if e := el.Value.(*entry); !e.InStep {
					t.Fatalf("op %d: home %s over window %d with idle active %s", op, name, w, e.ID)
				}
			}
		}
	}
}

// TestReadyBounded pins that a node that never calls Resumable cannot grow the ready list
// without bound, and that compaction keeps the live entry.
func TestReadyBounded(t *testing.T) {
	a := newRegistry(t, func(c *Config) { c.MaxAgents = 2; c.Controller.InitialWindow = 1 })
	arrive(t, a, t0, "x", "n1", Admit)
	for i := range 100 {
		id := fmt.Sprintf("w%d", i)
		arrive(t, a, t0, id, "n1", Wait)
		a.Finish(t0, "x") // id takes the slot and is listed ready
		a.StepDone(t0, id, 0)
		a.Finish(t0, id)
		arrive(t, a, t0, "x", "n1", Admit)
	}
	arrive(t, a, t0, "last", "n1", Wait)
	a.Finish(t0, "x")
	a.mu.Lock()
	n := len(a.ready)
	a.mu.Unlock()
	if n > 2*2+16 {
		t.Fatalf("ready list holds %d ids", n)
	}
	if got := a.Resumable(); !slices.Equal(got, []string{"last"}) {
		t.Fatalf("Resumable = %v, want [last]", got)
	}
}

func TestStrings(t *testing.T) {
	tests := []struct{ got, want string }{
		{Absent.String(), "absent"}, {Waiting.String(), "waiting"}, {Active.String(), "active"},
		{Paused.String(), "paused"}, {Admit.String(), "admit"}, {Wait.String(), "wait"},
		{Action(0).String(), "invalid"}, {Increase.String(), "increase"},
		{Decrease.String(), "decrease"}, {Hold.String(), "hold"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("String() = %q, want %q", tt.got, tt.want)
		}
	}
}

// TestObserveKeptCountsOnlyAgentsThatStayed pins that the kept counts, the controller's hit
// rate, leave out an agent that was paused between its steps: it is expected to lose its
// prefix, and counting it would make each cut look like more thrashing.
func TestObserveKeptCountsOnlyAgentsThatStayed(t *testing.T) {
	a := newRegistry(t, window(2))
	arrive(t, a, t0, "a", "n1", Admit)
	a.StepDone(t0, "a", 200)
	arrive(t, a, t0.Add(time.Second), "b", "n1", Admit)
	a.StepDone(t0.Add(time.Second), "b", 200)
	arrive(t, a, t0.Add(2*time.Second), "b", "", Admit)
	a.Observe("b", 100, 300) // b stayed active: 100 avoided, 100 recomputed, kept
	a.Tick(t0.Add(2*time.Second), "n1", 0.95, 0.1)
	if state(t, a, "a") != Paused {
		t.Fatalf("a is %v, want paused by the cut", state(t, a, "a"))
	}
	a.StepDone(t0.Add(3*time.Second), "b", 400)
	a.Finish(t0.Add(3*time.Second), "b") // room: a resumes
	arrive(t, a, t0.Add(3*time.Second), "a", "", Admit)
	a.Observe("a", 0, 300) // a was paused: 200 recomputed, not kept
	s := a.Stats()
	if s.RecomputeAvoidedTokens != 100 || s.RecomputedTokens != 300 {
		t.Fatalf("totals avoided %d recomputed %d, want 100 and 300", s.RecomputeAvoidedTokens, s.RecomputedTokens)
	}
	if s.KeptAvoidedTokens != 100 || s.KeptRecomputedTokens != 100 {
		t.Fatalf("kept avoided %d recomputed %d, want b's 100 and 100 only", s.KeptAvoidedTokens, s.KeptRecomputedTokens)
	}
}

// TestGrowth pins the step-to-step prompt growth the node counts in the predicted KV use: a
// moving average over every agent's steps, where a step that asks again with the same prompt
// (a held step retried) and a prompt that shrank are no samples.
func TestGrowth(t *testing.T) {
	a := newRegistry(t, window(4))
	steps := []struct {
		id     string
		prompt int
		want   float64
	}{
		{"a", 1000, 0},    // a first step: nothing to grow from
		{"a", 3000, 2000}, // the first sample is the average
		{"a", 3000, 2000}, // the same step asking again
		{"b", 500, 2000},  // another agent's first step
		{"b", 1500, 1900}, // 2000 + 0.1 × (1000 − 2000)
		{"a", 2000, 1900}, // shorter: the client cut its context; no sample
		{"a", 2500, 1760}, // grows from the cut prompt: 1900 + 0.1 × (500 − 1900)
		{"a", 0, 1760},    // unknown prompt
	}
	for i, s := range steps {
		if _, err := a.Arrive(t0.Add(time.Duration(i)*time.Second), s.id, "n1", s.prompt); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if got := a.Stats().GrowthTokens; math.Abs(got-s.want) > 1e-9 {
			t.Fatalf("step %d (%s, prompt %d): growth %v, want %v", i, s.id, s.prompt, got, s.want)
		}
	}
}

func TestHomed(t *testing.T) {
	a := newRegistry(t, window(1))
	t0 := time.Unix(0, 0)
	arrive(t, a, t0, "a", "h1", Admit)
	arrive(t, a, t0.Add(1*time.Second), "b", "h1", Wait)
	arrive(t, a, t0.Add(2*time.Second), "x", "h2", Admit)
	arrive(t, a, t0.Add(3*time.Second), "c", "h1", Wait)
	a.StepDone(t0.Add(4*time.Second), "a", 200) // a is now the most recent of h1
	tests := []struct {
		home string
		max  int
		n    int
		want []string
	}{
		{"h1", 10, 3, []string{"a", "c", "b"}},
		{"h1", 2, 3, []string{"a", "c"}},
		{"h1", 0, 3, nil},
		{"h2", 10, 1, []string{"x"}},
		{"h3", 10, 0, nil},
	}
	for _, tt := range tests {
		n, got := a.Homed(tt.home, nil, tt.max)
		if n != tt.n || !slices.Equal(got, tt.want) {
			t.Errorf("Homed(%s, %d) = %d %v, want %d %v", tt.home, tt.max, n, got, tt.n, tt.want)
		}
	}
	a.Finish(t0.Add(5*time.Second), "c")
	if n, got := a.Homed("h1", nil, 10); n != 2 || !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("after c finished: %d %v, want 2 [a b]", n, got)
	}
}

// TestFootprint pins how the Registry learns the agents' footprint: each ended agent's
// step-end contexts and steps go into moving averages (weight 0.1) whose ratio is the
// footprint, so a long session counts for more; the controller gets it, over the pool's size,
// once as many agents have ended as it would let into the window.
func TestFootprint(t *testing.T) {
	a := newRegistry(t, window(8))
	a.TickSignals(t0, "n1", Signals{U: 0.1, H: 1, PoolTokens: 1000})
	run := func(id string, contexts ...int) {
		t.Helper()
		for i, c := range contexts {
			if _, err := a.Arrive(t0, id, "n1", c-10); err != nil {
				t.Fatal(err)
			}
			if st := a.StepDone(t0, id, c); st != Active {
				t.Fatalf("%s step %d: %v, want active", id, i, st)
			}
		}
		a.Finish(t0, id)
	}
	run("short", 100, 200)     // 300 over 2 steps
	run("long", 100, 300, 500) // 900 over 3
	// held 300 + 0.1*(900-300) = 360, steps 2 + 0.1*(3-2) = 2.1: 171.4 (per agent, 154.3)
	if got := a.Stats().FootprintTokens; math.Abs(got-360/2.1) > 1e-9 {
		t.Fatalf("FootprintTokens %v, want %v", got, 360/2.1)
	}
	cap := func() int {
		a.TickSignals(t0, "n1", Signals{U: 0.1, H: 1, PoolTokens: 1000})
		return a.Stats().Homes[0].Controller.Cap
	}
	// Share 0.171: it would let in 0.9/0.171 = 5.25 agents, and 2 have ended.
	if got := cap(); got != 512 {
		t.Fatalf("Cap %d after 2 agents ended, want MaxWindow: the footprint is not trusted yet", got)
	}
	for i := range 4 {
		run(fmt.Sprint("more", i), 171, 171)
	}
	f := a.Stats().FootprintTokens
	if got, want := cap(), int(0.9/(f/1000)); got != want || want < 5 {
		t.Fatalf("Cap %d after 6 agents ended (footprint %.1f tokens), want %d", got, f, want)
	}
}

// TestPredictionFollowsTheWindow pins the Registry's side of Left and Joined: between ticks
// the controller's prediction Next loses a leaver's share of the pool and gains the share of
// the agent let into its slot.
func TestPredictionFollowsTheWindow(t *testing.T) {
	a := newRegistry(t, window(1))
	if _, err := a.Arrive(t0, "a", "n1", 50); err != nil {
		t.Fatal(err)
	}
	if d, err := a.Arrive(t0, "b", "n1", 200); err != nil || d.Action != Wait {
		t.Fatalf("b: %+v, %v; want it waiting", d, err)
	}
	a.StepDone(t0, "a", 100)
	a.TickSignals(t0, "n1", Signals{U: 0.5, Next: 0.5, H: 0.9, PoolTokens: 1000})
	a.Finish(t0, "a") // 0.5 - 100/1000, then b's 200/1000 (no growth measured yet)
	if state(t, a, "b") != Active {
		t.Fatalf("b is %v, want active in a's slot", state(t, a, "b"))
	}
	if got := a.Stats().Homes[0].Controller.Next; math.Abs(got-0.6) > 1e-9 {
		t.Fatalf("Next %v after a left and b joined, want 0.6", got)
	}
}

// TestScoped pins that an agent's id is its tenant's: equal ids of two tenants differ, and no
// tenant and id read as another tenant's.
func TestScoped(t *testing.T) {
	if Scoped("acme", "a") != Scoped("acme", "a") {
		t.Error("Scoped is not stable")
	}
	for _, p := range [][2][2]string{
		{{"acme", "a"}, {"globex", "a"}},
		{{"acme", "b/c"}, {"acme/b", "c"}},
		{{"", "a"}, {"a", ""}},
	} {
		if x, y := Scoped(p[0][0], p[0][1]), Scoped(p[1][0], p[1][1]); x == y {
			t.Errorf("Scoped%q = Scoped%q = %q", p[0], p[1], x)
		}
	}
}
