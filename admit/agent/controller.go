package agent

import (
	"math"
	"time"
)

// Move says what one tick did to the window.
type Move int8

const (
	Hold     Move = 0  // the window kept its size
	Increase Move = 1  // increase: predicted U below target (by slow start or by Alpha)
	Decrease Move = -1 // multiplicative decrease: thrashing
)

func (m Move) String() string {
	switch m {
	case Increase:
		return "increase"
	case Decrease:
		return "decrease"
	default:
		return "hold"
	}
}

// Controller is the AIMD window of one home node. The zero value is not usable; build one
// with NewController. It is not safe for concurrent use on its own; the Registry serialises it.
type Controller struct {
	cfg ControllerConfig
	w   float64 // kept fractional so several small increases add up

	ewma     float64
	haveEWMA bool
	cooldown int
	// slow is true until the first tick that finds no KV headroom SlowStartSteps steps
	// ahead (which every decrease is): until then an increase may double the window (see
	// ControllerConfig.SlowStartSteps).
	slow bool
	// cap is the most agents HighU of the pool holds at the last Signals.Footprint
	// (MaxWindow while it is unknown).
	cap   int
	sized bool // cap comes from a footprint

	lastU, lastNext, lastH float64
	lastTick               time.Time
	lastMove               Move
	ticks                  uint64
	decreases              uint64
}

// NewController fills cfg's zero fields with their defaults, validates it and returns a
// controller at cfg.InitialWindow.
func NewController(cfg ControllerConfig) (*Controller, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	return &Controller{cfg: cfg, w: float64(cfg.InitialWindow), slow: cfg.SlowStartSteps > 0, cap: cfg.MaxWindow}, nil
}

// Tick feeds one control interval's KV use u and prefix hit rate h (both 0..1, clamped) and
// returns the window. A NaN sample (an engine that has not reported yet) is ignored.
func (c *Controller) Tick(now time.Time, u, h float64) int {
	w, _ := c.TickDemand(now, u, h, -1)
	return w
}

// TickDemand is Tick that also knows demand, the agents that want a slot (active, paused and
// waiting); demand < 0 means unknown. The window grows only while demand fills it, so a
// quiet period cannot inflate it to MaxWindow and admit a burst of new agents all at once
// (the congestion-window validation rule of TCP). It also returns what the tick did.
func (c *Controller) TickDemand(now time.Time, u, h float64, demand int) (int, Move) {
	return c.TickSignals(now, Signals{U: u, H: h, Demand: demand})
}

// Signals is one control interval's samples.
type Signals struct {
	// U is the KV use the window's agents need now, 0..1; NaN skips the tick.
	U float64
	// Next is the KV use they will need at their next steps, when every active agent comes
	// back with a longer context, 0..1. Below U (or unset) it is taken to be U. The window
	// grows only while Next is under TargetU, so it stops letting agents in a step before
	// their growth would overflow the pool; a cut, which pauses agents, still needs U itself
	// high, so a growth that is only predicted never pauses anyone.
	Next float64
	// H is the prefix hit rate on the agents' earlier context, 0..1; NaN skips the tick.
	H float64
	// Demand is the number of agents that want a slot (active, paused, waiting); < 0 unknown.
	Demand int
	// Active is the number of agents in the window now, whose use U and Next measure; 0 is
	// unknown. Slow start divides their use by it to tell how many more agents the headroom
	// holds.
	Active int
	// Footprint is the share of the pool one agent holds on average over its life (0 or NaN:
	// unknown): its mean context at the ends of its steps, learned from agents that ended.
	// The window does not grow past the agents HighU of the pool holds at that footprint
	// (ControllerStats.Cap), and an agent leaving a window above that takes its slot with it.
	Footprint float64
	// PoolTokens is the KV pool's size in tokens; 0 is unknown. The Registry turns an agent's
	// context into a share of the pool with it, so that an agent leaving or entering the window
	// between ticks moves the prediction Next by what it needs. The controller ignores it.
	PoolTokens int
}

// TickSignals is TickDemand with the predicted KV use Signals.Next.
func (c *Controller) TickSignals(now time.Time, s Signals) (int, Move) {
	u, h, demand := s.U, s.H, s.Demand
	if math.IsNaN(u) || math.IsNaN(h) {
		return c.Window(), Hold
	}
	u, h = clamp01(u), clamp01(h)
	next := u
	if !math.IsNaN(s.Next) && !math.IsInf(s.Next, 0) {
		next = max(s.Next, u) // not clamped: a prediction may exceed the pool
	}
	c.ticks++
	c.lastU, c.lastNext, c.lastH, c.lastTick = u, next, h, now
	// The use after SlowStartSteps more steps (one with slow start off) of every active agent,
	// each growing as Next predicts for one.
	ahead := u + float64(max(c.cfg.SlowStartSteps, 1))*(next-u)

	// The ceiling: the agents HighU of the pool holds at the agents' footprint, once it is
	// known (Signals.Footprint).
	c.cap, c.sized = c.cfg.MaxWindow, false
	if f := s.Footprint; f > 0 && !math.IsInf(f, 0) {
		c.cap = int(min(max(math.Floor(c.cfg.HighU/f), float64(c.cfg.MinWindow)), float64(c.cfg.MaxWindow)))
		c.sized = true
	}

	// Falling is judged against the average of earlier samples, before this one joins it.
	falling := c.haveEWMA && h < c.ewma-max(c.cfg.HitMargin, 0)
	if c.haveEWMA {
		c.ewma += c.cfg.HitWeight * (h - c.ewma)
	} else {
		c.ewma, c.haveEWMA = h, true
	}
	// With a ceiling the window grows to it, and thrashing is the hit rate's average under
	// the floor; before, it grows while the use ahead is under TargetU, and one interval's H
	// falling or under the floor is thrashing.
	room, thrashing := ahead < c.cfg.TargetU, falling || h < c.cfg.HitFloor
	if c.sized {
		room, thrashing = true, c.ewma < c.cfg.HitFloor
	}

	move := Hold
	switch {
	case c.cooldown > 0:
		c.cooldown--
	case u >= c.cfg.HighU && thrashing:
		c.w = math.Max(float64(c.cfg.MinWindow), c.w*c.cfg.Beta)
		c.cooldown = c.cfg.CooldownTicks
		c.decreases++
		move = Decrease
	case room && (demand < 0 || demand >= c.Window()) && c.Window() < c.cap:
		c.w = math.Min(float64(c.cap), c.w+c.increase(u, ahead, demand, s.Active))
		move = Increase
	}
	if ahead >= c.cfg.TargetU {
		// The headroom is used up: the window's agents fill the pool within SlowStartSteps
		// steps. Every decrease is such a tick, as a cut needs U >= HighU >= TargetU.
		c.slow = false
	}
	c.lastMove = move
	return c.Window(), move
}

// Left tells the controller that an agent left the window (finished or gone), leaving active
// agents in it, and that it needed share of the pool at its next step (its context plus one
// step's growth; 0 unknown), by which the prediction Next falls. The window then follows the
// agents down instead of keeping the slot for a newcomer while it is above its ceiling, and,
// before the agents' footprint is known, while what is left of Next is at or above HighU: the
// agents in the window already need more KV at their next steps than the pool has, a newcomer
// let in now would push it over, and the cut that follows would pause agents whose prefixes
// are then lost. A decrease by attrition pauses no one. Subtracting the leaver's share
// matters: Next counts every active agent, so an agent of 30k tokens leaving a pool of 131k
// takes a quarter of it along.
func (c *Controller) Left(active int, share float64) {
	c.lastNext = math.Max(0, c.lastNext-share)
	if (!c.sized && c.lastNext >= c.cfg.HighU) || c.Window() > c.cap {
		c.w = math.Max(float64(c.cfg.MinWindow), math.Min(c.w, float64(active)))
	}
}

// Joined tells the controller that an agent entered the window between ticks, needing share of
// the pool at its next step (0 unknown): the prediction Next that Left compares grows by it
// until the next tick measures it.
func (c *Controller) Joined(share float64) { c.lastNext += share }

// increase is how much an increase adds: Alpha, or in slow start the agents the headroom
// TargetU-ahead holds at the window's use per agent after SlowStartSteps steps (ahead/active),
// capped at doubling and at the agents that want a slot, and never less than Alpha. Without a
// growth prediction (ahead == u) or the active count, slow start has nothing to size a step
// by, and adds Alpha.
func (c *Controller) increase(u, ahead float64, demand, active int) float64 {
	if !c.slow || active <= 0 || ahead <= u {
		return c.cfg.Alpha
	}
	inc := math.Min(c.w, math.Floor((c.cfg.TargetU-ahead)*float64(active)/ahead))
	if demand >= 0 {
		inc = math.Min(inc, float64(demand)-c.w)
	}
	return math.Max(inc, c.cfg.Alpha)
}

// Window returns the current number of agents allowed to be active.
func (c *Controller) Window() int {
	w := int(math.Floor(c.w + 1e-9)) // 1e-9: 0.7*10/0.7 style float noise must not lose a slot
	return min(max(w, c.cfg.MinWindow), c.cfg.MaxWindow)
}

// ControllerStats is what a controller last saw and did.
type ControllerStats struct {
	Window    int
	U, H      float64 // the last sample
	Next      float64 // the last predicted KV use (Signals.Next, moved by Left and Joined); may exceed 1
	Cap       int     // the window's ceiling from the agents' footprint; MaxWindow while unknown
	HitEWMA   float64 // the hit-rate average H is compared against
	LastTick  time.Time
	LastMove  Move
	SlowStart bool // still in slow start: the KV headroom SlowStartSteps ahead never ran out
	Ticks     uint64
	Decreases uint64
}

// Stats returns the controller's state.
func (c *Controller) Stats() ControllerStats {
	return ControllerStats{Window: c.Window(), U: c.lastU, Next: c.lastNext, Cap: c.cap, H: c.lastH, HitEWMA: c.ewma,
		LastTick: c.lastTick, LastMove: c.lastMove, SlowStart: c.slow, Ticks: c.ticks, Decreases: c.decreases}
}

func clamp01(f float64) float64 { return min(max(f, 0), 1) }
