package agent

import (
	"errors"
	"math"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

type sample struct {
	u, h   float64
	demand int // -1: unknown
}

func newController(t *testing.T, mod func(*ControllerConfig)) *Controller {
	t.Helper()
	cfg := DefaultControllerConfig()
	if mod != nil {
		mod(&cfg)
	}
	c, err := NewController(cfg)
	if err != nil {
		t.Fatalf("NewController: %v", err)
	}
	return c
}

// aimd is mod with slow start off: the AIMD rule the window follows once slow start is over.
func aimd(mod func(*ControllerConfig)) func(*ControllerConfig) {
	return func(c *ControllerConfig) {
		c.SlowStartSteps = -1
		if mod != nil {
			mod(c)
		}
	}
}

// TestControllerRule pins the AIMD rule (slow start off; TestControllerSlowStart pins it).
func TestControllerRule(t *testing.T) {
	steady := func(u, h float64, n int) []sample {
		s := make([]sample, n)
		for i := range s {
			s[i] = sample{u, h, -1}
		}
		return s
	}
	tests := []struct {
		name    string
		mod     func(*ControllerConfig)
		samples []sample
		want    []int // window after each sample
	}{
		{"increase below target", nil, steady(0.5, 0.9, 3), []int{9, 10, 11}},
		{"hold in the band", nil, steady(0.85, 0.9, 3), []int{8, 8, 8}},
		{"hold at high u with steady h", nil, steady(0.95, 0.6, 3), []int{8, 8, 8}},
		{"hold at high u with h inside the margin", nil,
			[]sample{{0.95, 0.6, -1}, {0.95, 0.56, -1}}, []int{8, 8}},
		{"decrease on thrashing then cooldown", func(c *ControllerConfig) { c.InitialWindow = 20 },
			[]sample{{0.95, 0.9, -1}, {0.97, 0.4, -1}, {0.97, 0.3, -1}, {0.97, 0.2, -1}},
			[]int{20, 14, 14, 9}}, // 20*0.7=14, cooldown hold, 14*0.7=9.8
		{"no cooldown cuts every tick", func(c *ControllerConfig) { c.InitialWindow = 20; c.CooldownTicks = -1 },
			[]sample{{0.95, 0.9, -1}, {0.97, 0.4, -1}, {0.97, 0.3, -1}},
			[]int{20, 14, 9}},
		{"decrease at high u with h under the floor though steady", func(c *ControllerConfig) { c.InitialWindow = 20 },
			steady(0.95, 0.3, 4), []int{14, 14, 9, 9}},
		{"no floor: steady low h holds", func(c *ControllerConfig) { c.HitFloor = -1 }, steady(0.95, 0.3, 3), []int{8, 8, 8}},
		{"h under the floor at moderate u holds", nil, steady(0.85, 0.1, 3), []int{8, 8, 8}},
		{"falling h at moderate u holds", nil,
			[]sample{{0.85, 0.9, -1}, {0.85, 0.3, -1}}, []int{8, 8}},
		{"falling h below target still increases", nil,
			[]sample{{0.5, 0.9, -1}, {0.5, 0.3, -1}}, []int{9, 10}},
		{"max bound", func(c *ControllerConfig) { c.MaxWindow = 10 }, steady(0.1, 0.9, 4), []int{9, 10, 10, 10}},
		{"min bound", func(c *ControllerConfig) { c.InitialWindow = 3; c.MinWindow = 2; c.CooldownTicks = -1 },
			[]sample{{1, 1, -1}, {1, 0.5, -1}, {1, 0.2, -1}, {1, 0, -1}}, []int{3, 2, 2, 2}},
		{"fractional alpha accumulates", func(c *ControllerConfig) { c.Alpha = 0.5 }, steady(0.1, 0.9, 4), []int{8, 9, 9, 10}},
		{"demand below window holds", nil,
			[]sample{{0.1, 0.9, 3}, {0.1, 0.9, 8}, {0.1, 0.9, 9}, {0.1, 0.9, 5}}, []int{8, 9, 10, 10}},
		{"nan sample ignored", nil,
			[]sample{{math.NaN(), 0.9, -1}, {0.5, math.NaN(), -1}, {0.5, 0.9, -1}}, []int{8, 8, 9}},
		{"out of range clamped", func(c *ControllerConfig) { c.InitialWindow = 10 },
			[]sample{{-3, 2, -1}, {7, -1, -1}}, []int{11, 7}}, // u=0 grows; u=1 with h 1->0 cuts
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newController(t, aimd(tt.mod))
			for i, s := range tt.samples {
				got, _ := c.TickDemand(t0.Add(time.Duration(i)*time.Second), s.u, s.h, s.demand)
				if got != tt.want[i] {
					t.Fatalf("tick %d (u=%v h=%v): window %d, want %d", i, s.u, s.h, got, tt.want[i])
				}
				if got != c.Window() {
					t.Fatalf("tick %d: returned %d but Window() is %d", i, got, c.Window())
				}
			}
		})
	}
}

// TestControllerPredictedUse pins the rule for Signals.Next, the KV use the active agents
// will need at their next steps: it stops the increase, but a cut still needs U itself high,
// so a growth that is only predicted never pauses an agent. Slow start off, as above.
func TestControllerPredictedUse(t *testing.T) {
	tests := []struct {
		name    string
		mod     func(*ControllerConfig)
		signals []Signals
		want    []int // window after each tick
		moves   []Move
	}{
		{"next under target increases", nil,
			[]Signals{{U: 0.3, Next: 0.5, H: 0.9, Demand: -1}, {U: 0.3, Next: 0.79, H: 0.9, Demand: -1}},
			[]int{9, 10}, []Move{Increase, Increase}},
		{"next at target holds though u is low", nil,
			[]Signals{{U: 0.3, Next: 0.8, H: 0.9, Demand: -1}, {U: 0.5, Next: 0.95, H: 0.9, Demand: -1}},
			[]int{8, 8}, []Move{Hold, Hold}},
		{"next over high u with the hit rate collapsing holds", nil,
			[]Signals{{U: 0.6, Next: 1, H: 0.9, Demand: -1}, {U: 0.6, Next: 1, H: 0.2, Demand: -1}, {U: 0.6, Next: 1, H: 0.1, Demand: -1}},
			[]int{8, 8, 8}, []Move{Hold, Hold, Hold}},
		{"u itself high with the hit rate collapsing cuts", func(c *ControllerConfig) { c.InitialWindow = 20 },
			[]Signals{{U: 0.95, Next: 1, H: 0.9, Demand: -1}, {U: 0.95, Next: 1, H: 0.2, Demand: -1}},
			[]int{20, 14}, []Move{Hold, Decrease}},
		{"unset next is u", nil,
			[]Signals{{U: 0.5, H: 0.9, Demand: -1}, {U: 0.85, H: 0.9, Demand: -1}},
			[]int{9, 9}, []Move{Increase, Hold}},
		{"next below u is u", nil,
			[]Signals{{U: 0.85, Next: 0.1, H: 0.9, Demand: -1}},
			[]int{8}, []Move{Hold}},
		{"nan next is u", nil,
			[]Signals{{U: 0.5, Next: math.NaN(), H: 0.9, Demand: -1}},
			[]int{9}, []Move{Increase}},
		{"demand below window holds under target", nil,
			[]Signals{{U: 0.1, Next: 0.2, H: 0.9, Demand: 3}},
			[]int{8}, []Move{Hold}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newController(t, aimd(tt.mod))
			checkTicks(t, c, tt.signals, tt.want, tt.moves)
			if last := tt.signals[len(tt.signals)-1]; !math.IsNaN(last.Next) && c.Stats().Next < last.U {
				t.Fatalf("Stats().Next = %v, below U %v", c.Stats().Next, last.U)
			}
		})
	}
}

// TestControllerLeftFollowsTheAgentsDown pins the decrease by attrition: an agent leaving the
// window while the predicted use is at or above HighU takes its slot with it (the window
// follows the active agents down, never under MinWindow), and below HighU the slot stays for
// the next agent.
func TestControllerLeftFollowsTheAgentsDown(t *testing.T) {
	tests := []struct {
		name   string
		next   float64
		active int     // agents left in the window
		share  float64 // what the leaver needed
		want   int
	}{
		{"predicted overflow follows the agents", 0.95, 9, 0, 9},
		{"at high u follows", 0.9, 7, 0, 7},
		{"under high u keeps the slot", 0.85, 9, 0, 10},
		{"never above the window", 1, 12, 0, 10},
		{"never under the minimum", 1, 0, 0, 1},
		{"a large leaver takes the overflow along", 1.2, 9, 0.35, 10},
		{"a small leaver leaves it", 1.2, 9, 0.05, 9},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newController(t, aimd(func(c *ControllerConfig) { c.InitialWindow = 10 }))
			c.TickSignals(t0, Signals{U: 0.5, Next: tt.next, H: 0.9, Demand: 10})
			c.Left(tt.active, tt.share)
			if got := c.Window(); got != tt.want {
				t.Fatalf("window %d after Left(%d, %v) at next %v, want %d", got, tt.active, tt.share, tt.next, tt.want)
			}
			if got, want := c.Stats().Next, max(tt.next-tt.share, 0); math.Abs(got-want) > 1e-9 {
				t.Fatalf("Next %v after the leaver, want %v", got, want)
			}
		})
	}
}

// TestControllerSlowStart pins slow start: until the first tick at which the active agents,
// SlowStartSteps (4) steps ahead, fill the pool to TargetU, an increase adds what the headroom
// then holds at the predicted use per agent, capped at doubling and at demand, and at least
// Alpha; after that tick, and before any growth is predicted, the window grows by Alpha, and
// only while the use those steps ahead is under TargetU.
func TestControllerSlowStart(t *testing.T) {
	tests := []struct {
		name    string
		mod     func(*ControllerConfig)
		signals []Signals
		want    []int // window after each tick
		slow    bool  // still in slow start at the end
	}{
		{"a burst is admitted in a few ticks, not one agent a tick", nil,
			// 4 steps ahead: 0.05, 0.1, 0.2 of the pool: doubling, then the demand of 40
			[]Signals{{U: 0.01, Next: 0.02, H: 1, Demand: 40, Active: 8}, {U: 0.02, Next: 0.04, H: 1, Demand: 40, Active: 16},
				{U: 0.04, Next: 0.08, H: 1, Demand: 40, Active: 32}, {U: 0.05, Next: 0.1, H: 1, Demand: 40, Active: 40}},
			[]int{16, 32, 40, 41}, true}, // at demand, Alpha (as the AIMD rule allows)
		{"capped by the headroom steps ahead, ended when they fill the pool", nil,
			// ahead 0.4: (0.8-0.4)*8/0.4 = 8; ahead 0.5: 0.3*16/0.5 = 9.6; ahead 0.76: 0.04*25/0.76 < 2;
			// ahead 0.85 ends it and holds, though Next 0.55 is under target; ahead 0.4: Alpha
			[]Signals{{U: 0.2, Next: 0.25, H: 0.9, Demand: 100, Active: 8}, {U: 0.3, Next: 0.35, H: 0.9, Demand: 100, Active: 16},
				{U: 0.4, Next: 0.49, H: 0.9, Demand: 100, Active: 25}, {U: 0.45, Next: 0.55, H: 0.9, Demand: 100, Active: 26},
				{U: 0.2, Next: 0.25, H: 0.9, Demand: 100, Active: 26}},
			[]int{16, 25, 26, 26, 27}, false},
		{"growth that fills the pool steps ahead ends it at once", nil,
			// Next 0.45 is under target, but 4 steps of growth are 0.9: hold; then Alpha
			[]Signals{{U: 0.3, Next: 0.45, H: 0.9, Demand: 100, Active: 8}, {U: 0.1, Next: 0.11, H: 0.9, Demand: 100, Active: 8}},
			[]int{8, 9}, false},
		{"no growth predicted: Alpha, and it goes on", nil,
			[]Signals{{U: 0.1, Next: 0.1, H: 0.9, Demand: 100, Active: 8}, {U: 0.1, Next: math.NaN(), H: 0.9, Demand: 100, Active: 9},
				{U: 0.1, Next: 0.11, H: 0.9, Demand: 100, Active: 10}},
			[]int{9, 10, 20}, true},
		{"active unknown: Alpha", nil,
			[]Signals{{U: 0.1, Next: 0.11, H: 0.9, Demand: -1}, {U: 0.1, Next: 0.11, H: 0.9, Demand: -1}},
			[]int{9, 10}, true},
		{"no headroom ends it", nil,
			[]Signals{{U: 0.5, Next: 0.8, H: 0.9, Demand: 100, Active: 8}, {U: 0.1, Next: 0.11, H: 0.9, Demand: 100, Active: 8},
				{U: 0.1, Next: 0.11, H: 0.9, Demand: 100, Active: 9}},
			[]int{8, 9, 10}, false},
		{"a decrease ends it", func(c *ControllerConfig) { c.InitialWindow = 20 },
			[]Signals{{U: 0.95, H: 0.3, Demand: 100, Active: 20}, {U: 0.3, Next: 0.31, H: 0.9, Demand: 100, Active: 14},
				{U: 0.1, Next: 0.11, H: 0.9, Demand: 100, Active: 14}},
			[]int{14, 14, 15}, false}, // cut (H under the floor), cooldown, then Alpha
		{"a hold for lack of demand keeps it", nil,
			[]Signals{{U: 0.1, Next: 0.11, H: 0.9, Demand: 3, Active: 3}, {U: 0.1, Next: 0.11, H: 0.9, Demand: 30, Active: 3}},
			[]int{8, 16}, true}, // 0.66*3/0.14 = 14, capped at doubling
		{"max bound", func(c *ControllerConfig) { c.MaxWindow = 12 },
			[]Signals{{U: 0.1, Next: 0.11, H: 0.9, Demand: -1, Active: 8}, {U: 0.1, Next: 0.11, H: 0.9, Demand: -1, Active: 12}},
			[]int{12, 12}, true},
		{"off: Alpha from the start", func(c *ControllerConfig) { c.SlowStartSteps = -1 },
			[]Signals{{U: 0.1, Next: 0.11, H: 0.9, Demand: -1, Active: 8}, {U: 0.1, Next: 0.11, H: 0.9, Demand: -1, Active: 9}},
			[]int{9, 10}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newController(t, tt.mod)
			for i, s := range tt.signals {
				if got, _ := c.TickSignals(t0.Add(time.Duration(i)*time.Second), s); got != tt.want[i] {
					t.Fatalf("tick %d (%+v): window %d, want %d", i, s, got, tt.want[i])
				}
			}
			if got := c.Stats().SlowStart; got != tt.slow {
				t.Fatalf("Stats().SlowStart = %v, want %v", got, tt.slow)
			}
		})
	}
}

// TestControllerConstantLoad pins that a constant load never makes the window flip between
// increase and decrease, and that it settles.
func TestControllerConstantLoad(t *testing.T) {
	for _, steps := range []int{4, 0} { // slow start on and off
		for _, u := range []float64{0, 0.3, 0.79, 0.8, 0.85, 0.9, 0.95, 1} {
			for _, h := range []float64{0, 0.35, 0.9, 1} {
				constantLoad(t, steps, u, h)
			}
		}
	}
}

// constantLoad ticks a controller with slow start over steps 100 times with the same U and H,
// Next a little above U and the window all active.
func constantLoad(t *testing.T, steps int, u, h float64) {
	t.Helper()
	c := newController(t, func(c *ControllerConfig) { c.MaxWindow = 64; c.SlowStartSteps = steps })
	slow := steps > 0
	var dirs []Move
	var windows []int
	for i := range 100 {
		s := Signals{U: u, Next: u + 0.01, H: h, Demand: -1, Active: c.Window()}
		w, m := c.TickSignals(t0.Add(time.Duration(i)*time.Second), s)
		windows = append(windows, w)
		if m != Hold {
			dirs = append(dirs, m)
		}
	}
	for i := 1; i < len(dirs); i++ {
		if dirs[i] != dirs[0] {
			t.Fatalf("slow start %v, u=%v h=%v: moves %v change direction", slow, u, h, dirs)
		}
	}
	last := windows[len(windows)-20:]
	for _, w := range last {
		if w != last[0] {
			t.Fatalf("slow start %v, u=%v h=%v: window not settled over the last 20 ticks: %v", slow, u, h, last)
		}
	}
	want := 8
	switch {
	case u+0.01 < 0.8:
		want = 64 // from 8, in a few ticks of slow start or 56 of one agent a tick
	case u >= 0.9 && h < 0.5:
		want = 1 // under the hit floor at full KV: cut to the bound, never back up
	}
	if windows[99] != want {
		t.Fatalf("slow start %v, u=%v h=%v: window %d, want %d", slow, u, h, windows[99], want)
	}
}

// TestControllerClosedLoop drives a toy KV pool through the agent phases: every active
// agent's prefix grows for 100 ticks (warmup into the middle phase) and then stays put, and
// the hit rate collapses once the prefixes no longer fit. The controller must cut when
// thrashing starts, spend little time over-full, and end holding, not sawing up and down.
func TestControllerClosedLoop(t *testing.T) {
	c := newController(t, nil)
	load := func(w, tick int) float64 {
		perAgent := 0.01 + 0.0002*float64(min(tick, 100)) // 1% of the pool, growing to 3%
		return float64(w) * perAgent
	}
	var windows []int
	deep := 0 // ticks in deep thrashing, hit rate under 0.6
	w := c.Window()
	var h float64
	for i := range 300 {
		l := load(w, i)
		h = 0.9
		if l > 1 { // over-full: prefixes evicted before reuse
			h = 0.9 / (l * l)
		}
		if h < 0.6 {
			deep++
		}
		w = c.Tick(t0.Add(time.Duration(i)*time.Second), math.Min(1, l), h)
		windows = append(windows, w)
	}
	final := windows[len(windows)-1]
	// A slow drift a little past full lowers H by less than the margin and is held; what the
	// rule must prevent is the collapse (a fixed window of 46 ends at load 1.38, H 0.47).
	if l := load(final, 300); l < 0.8 || l > 1.05 || h < 0.8 {
		t.Fatalf("settled at window %d (load %.2f, hit %.2f), want load in [0.8, 1.05]: %v", final, l, h, windows)
	}
	for _, x := range windows[200:] {
		if x != final {
			t.Fatalf("window still moving after 200 ticks: %v", windows[200:])
		}
	}
	if c.Stats().Decreases == 0 {
		t.Fatalf("never cut: %v", windows)
	}
	if deep > 5 {
		t.Fatalf("deep thrashing for %d of 300 ticks: %v", deep, windows)
	}
}

func TestControllerConfigValidation(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*ControllerConfig)
	}{
		{"alpha negative", func(c *ControllerConfig) { c.Alpha = -1 }},
		{"alpha nan", func(c *ControllerConfig) { c.Alpha = math.NaN() }},
		{"beta one", func(c *ControllerConfig) { c.Beta = 1 }},
		{"beta negative", func(c *ControllerConfig) { c.Beta = -0.5 }},
		{"target negative", func(c *ControllerConfig) { c.TargetU = -0.1 }},
		{"high below target", func(c *ControllerConfig) { c.HighU = 0.7 }},
		{"high above one", func(c *ControllerConfig) { c.HighU = 1.1 }},
		{"hit weight negative", func(c *ControllerConfig) { c.HitWeight = -0.2 }},
		{"hit margin one", func(c *ControllerConfig) { c.HitMargin = 1 }},
		{"hit floor one", func(c *ControllerConfig) { c.HitFloor = 1 }},
		{"hit floor nan", func(c *ControllerConfig) { c.HitFloor = math.NaN() }},
		{"min negative", func(c *ControllerConfig) { c.MinWindow = -1 }},
		{"max below min", func(c *ControllerConfig) { c.MinWindow = 5; c.MaxWindow = 4; c.InitialWindow = 4 }},
		{"initial above max", func(c *ControllerConfig) { c.InitialWindow = 1000 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultControllerConfig()
			tt.mod(&cfg)
			if _, err := NewController(cfg); !errors.Is(err, ErrConfig) {
				t.Fatalf("NewController: %v, want ErrConfig", err)
			}
		})
	}
	if _, err := NewController(DefaultControllerConfig()); err != nil {
		t.Fatalf("defaults rejected: %v", err)
	}
	c, err := NewController(ControllerConfig{})
	if err != nil {
		t.Fatalf("zero config: %v", err)
	}
	if c.cfg != DefaultControllerConfig() {
		t.Errorf("zero config filled %+v, want the defaults", c.cfg)
	}
}

// TestControllerJoinedRaisesThePrediction pins that an agent let in between ticks counts in
// the prediction Left compares: with it the next leaver's slot goes, without it it stays.
func TestControllerJoinedRaisesThePrediction(t *testing.T) {
	for _, joined := range []float64{0, 0.1} {
		c := newController(t, aimd(func(c *ControllerConfig) { c.InitialWindow = 10 }))
		c.TickSignals(t0, Signals{U: 0.5, Next: 0.85, H: 0.9, Demand: 10})
		c.Joined(joined)
		c.Left(9, 0)
		want := map[float64]int{0: 10, 0.1: 9}[joined]
		if got := c.Window(); got != want {
			t.Errorf("joined %v: window %d after a leaver, want %d", joined, got, want)
		}
	}
}

// TestControllerCeiling pins the rule once the agents' footprint F is known: the window grows
// to floor(HighU/F) whatever U and Next say, no further (slow start included), follows the
// agents down by attrition while above it, and is cut on the hit rate's average under the
// floor, not on one interval's dip, which without a footprint cuts.
func TestControllerCeiling(t *testing.T) {
	const f = 0.09 // ceiling floor(0.9/0.09) = 10
	tests := []struct {
		name    string
		mod     func(*ControllerConfig)
		signals []Signals
		want    []int
		moves   []Move
	}{
		{"grows to the ceiling at high use and holds", nil,
			[]Signals{{U: 0.95, Next: 1.3, H: 0.9, Demand: 20, Footprint: f}, {U: 0.95, Next: 1.3, H: 0.9, Demand: 20, Footprint: f},
				{U: 0.95, Next: 1.3, H: 0.9, Demand: 20, Footprint: f}},
			[]int{9, 10, 10}, []Move{Increase, Increase, Hold}},
		{"without a footprint the same signals hold", nil,
			[]Signals{{U: 0.95, Next: 1.3, H: 0.9, Demand: 20}, {U: 0.95, Next: 1.3, H: 0.9, Demand: 20}},
			[]int{8, 8}, []Move{Hold, Hold}},
		{"one interval's dip does not cut", func(c *ControllerConfig) { c.InitialWindow = 10 },
			[]Signals{{U: 0.95, H: 0.9, Demand: 20, Footprint: f}, {U: 0.95, H: 0.1, Demand: 20, Footprint: f},
				{U: 0.95, H: 0.9, Demand: 20, Footprint: f}},
			[]int{10, 10, 10}, []Move{Hold, Hold, Hold}},
		{"without a footprint the dip cuts", func(c *ControllerConfig) { c.InitialWindow = 10 },
			[]Signals{{U: 0.95, H: 0.9, Demand: 20}, {U: 0.95, H: 0.1, Demand: 20}},
			[]int{10, 7}, []Move{Hold, Decrease}},
		{"a sustained collapse cuts once the average is under the floor", func(c *ControllerConfig) { c.InitialWindow = 10 },
			// H's average: 0.9, 0.74, 0.61, 0.51, 0.43
			[]Signals{{U: 0.95, H: 0.9, Demand: 20, Footprint: f}, {U: 0.95, H: 0.1, Demand: 20, Footprint: f},
				{U: 0.95, H: 0.1, Demand: 20, Footprint: f}, {U: 0.95, H: 0.1, Demand: 20, Footprint: f},
				{U: 0.95, H: 0.1, Demand: 20, Footprint: f}},
			[]int{10, 10, 10, 10, 7}, []Move{Hold, Hold, Hold, Hold, Decrease}},
		{"slow start stops at the ceiling", func(c *ControllerConfig) { c.SlowStartSteps = 4 },
			[]Signals{{U: 0.1, Next: 0.11, H: 0.9, Demand: 100, Active: 8, Footprint: f}},
			[]int{10}, []Move{Increase}},
		{"a footprint over the pool: the ceiling is MinWindow, nothing grows", nil,
			[]Signals{{U: 0.2, H: 0.9, Demand: 20, Footprint: 2}},
			[]int{8}, []Move{Hold}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newController(t, aimd(tt.mod))
			checkTicks(t, c, tt.signals, tt.want, tt.moves)
		})
	}

	t.Run("above the ceiling a leaver takes its slot", func(t *testing.T) {
		c := newController(t, aimd(func(c *ControllerConfig) { c.InitialWindow = 12 }))
		if w, m := c.TickSignals(t0, Signals{U: 0.5, Next: 0.6, H: 0.9, Demand: 12, Footprint: f}); w != 12 || m != Hold {
			t.Fatalf("window %d after %v above the ceiling, want 12 held", w, m)
		}
		if got := c.Stats().Cap; got != 10 {
			t.Fatalf("Cap %d, want 10", got)
		}
		for i, active := range []int{11, 10, 9} {
			c.Left(active, 0.05)
			if got, want := c.Window(), []int{11, 10, 10}[i]; got != want {
				t.Fatalf("window %d after a leaver left %d active, want %d", got, active, want)
			}
		}
	})
}

// checkTicks feeds c one tick of signals a second and checks the window and move after each.
func checkTicks(t *testing.T, c *Controller, signals []Signals, want []int, moves []Move) {
	t.Helper()
	for i, s := range signals {
		got, move := c.TickSignals(t0.Add(time.Duration(i)*time.Second), s)
		if got != want[i] || move != moves[i] {
			t.Fatalf("tick %d (%+v): window %d after %v, want %d after %v", i, s, got, move, want[i], moves[i])
		}
	}
}
