package agent

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// ErrConfig is wrapped by every configuration error New and NewController return.
var ErrConfig = errors.New("agent: invalid config")

// ControllerConfig sets the AIMD rule of one home's window; see the package documentation for
// why each default is what it is. A zero field takes its default (NewController fills it); the
// settings that can be turned off name the negative value that does it.
type ControllerConfig struct {
	// Alpha is the additive increase per control tick while the window has room to grow, once
	// slow start is over. Default 1: one more agent per interval, so the window probes for room slowly and
	// each step's effect on U is visible before the next.
	Alpha float64 `json:"alpha"`
	// Beta is the multiplicative decrease on thrashing, 0 < Beta < 1. Default 0.7: a 30% cut
	// leaves the thrashing regime within a few intervals; recompute cost grows with the square
	// of context length, so a gentle cut would keep paying it.
	Beta float64 `json:"beta"`
	// TargetU is the KV use, predicted SlowStartSteps steps ahead, below which a window without
	// a ceiling (no footprint known yet) grows. Default 0.8: the start of the band where, for
	// agents, KV fills with idle prefixes.
	TargetU float64 `json:"target_u"`
	// HighU is the KV use at or above which a falling hit rate means thrashing, and the share
	// of the pool the window's agents may hold at their footprint (the ceiling). Default 0.9,
	// or TargetU if that is higher. Between TargetU and HighU a window without a ceiling holds.
	HighU float64 `json:"high_u"`
	// HitWeight is the weight of a new sample in the hit-rate EWMA, 0 < HitWeight <= 1.
	// Default 0.2: the average remembers about five intervals, long enough that one noisy
	// sample is not a trend, short enough to follow a collapse.
	HitWeight float64 `json:"hit_weight"`
	// HitMargin is how far H must sit below its EWMA to count as falling, below 1.
	// Default 0.05: five points of hit rate, above the sampling noise of a busy engine.
	// Negative (-1): no margin, any fall counts.
	HitMargin float64 `json:"hit_margin"`
	// HitFloor is the hit rate under which, with U >= HighU, the window is cut even when H is
	// not falling (once the window has a ceiling: when H's EWMA is under it), below 1.
	// Default 0.5: when H is the hit rate on the agents' own earlier context (what the node
	// feeds it), a window that fits is near 1, and a window that has been thrashing long
	// enough for the average to catch up with it would otherwise hold. Negative (-1): no floor,
	// only a falling H cuts.
	HitFloor float64 `json:"hit_floor"`
	// CooldownTicks is the number of ticks after a decrease during which the window holds.
	// Default 1: KV is freed only as paused agents' prefixes age out, so U lags a cut by about
	// an interval; without the cooldown the controller would cut again on the same symptom.
	// Negative (-1): no cooldown.
	CooldownTicks int `json:"cooldown_ticks"`
	// MinWindow and MaxWindow bound the window, 1 <= MinWindow <= MaxWindow. Defaults 1 and
	// 512: one agent always makes progress; 512 is far above the agents one GPU host's KV pool
	// holds, so in practice U, not the bound, limits growth.
	MinWindow int `json:"min_window"`
	MaxWindow int `json:"max_window"`
	// InitialWindow is a new home's window before its first tick, in [MinWindow, MaxWindow].
	// Default 8 (or the bound it falls outside of): a small start, grown by slow start and then
	// by Alpha, like a congestion window.
	InitialWindow int `json:"initial_window"`
	// SlowStartSteps is slow start's horizon; negative (-1) turns slow start off. Until the first
	// tick at which the window's agents, after SlowStartSteps more steps each (growing as Next
	// predicts for one step), would fill the pool to TargetU, an increase adds the agents that
	// headroom holds at the use per agent it predicts, capped at doubling the window and at the
	// agents that want a slot, instead of Alpha; without a growth prediction yet (no agent's
	// second step) it adds Alpha. After that tick the window probes by Alpha only, as TCP's
	// congestion avoidance does after slow start.
	//
	// Why: sessions start in bursts, and at one agent an interval 40 agents arriving together
	// on an empty pool wait 16 s (at 500 ms) for slots they fit in. Why the horizon: an agent
	// comes back for several steps, each longer, so a ramp sized on one step of growth admits
	// in a second more agents than their growth over the next steps leaves room for, and the
	// cut that follows pauses them and loses their prefixes. Default 4: about the steps a new
	// agent still has ahead in sessions of a handful of steps (the load generator's run 3 to
	// 8); where that fills the pool slow start ends at once and the window ramps by Alpha.
	SlowStartSteps int `json:"slow_start_steps"`
}

// DefaultControllerConfig returns the documented controller defaults.
func DefaultControllerConfig() ControllerConfig {
	return ControllerConfig{
		Alpha:          1,
		Beta:           0.7,
		TargetU:        0.8,
		HighU:          0.9,
		HitWeight:      0.2,
		HitMargin:      0.05,
		HitFloor:       0.5,
		CooldownTicks:  1,
		MinWindow:      1,
		MaxWindow:      512,
		InitialWindow:  8,
		SlowStartSteps: 4,
	}
}

// fill sets every zero field to its default (the zero rule), then validates.
func (c *ControllerConfig) fill() error {
	d := DefaultControllerConfig()
	setF := func(v *float64, def float64) {
		if *v == 0 {
			*v = def
		}
	}
	setI := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	setF(&c.Alpha, d.Alpha)
	setF(&c.Beta, d.Beta)
	setF(&c.TargetU, d.TargetU)
	setF(&c.HighU, max(d.HighU, c.TargetU))
	setF(&c.HitWeight, d.HitWeight)
	setF(&c.HitMargin, d.HitMargin)
	setF(&c.HitFloor, d.HitFloor)
	setI(&c.CooldownTicks, d.CooldownTicks)
	setI(&c.MinWindow, d.MinWindow)
	setI(&c.MaxWindow, max(d.MaxWindow, c.MinWindow))
	if c.InitialWindow == 0 {
		c.InitialWindow = max(min(d.InitialWindow, c.MaxWindow), c.MinWindow)
	}
	setI(&c.SlowStartSteps, d.SlowStartSteps)
	return c.validate()
}

func (c ControllerConfig) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	finite := func(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }
	switch {
	case !finite(c.Alpha) || c.Alpha <= 0:
		return bad("alpha %v must be > 0", c.Alpha)
	case !finite(c.Beta) || c.Beta <= 0 || c.Beta >= 1:
		return bad("beta %v must be in (0, 1)", c.Beta)
	case !finite(c.TargetU) || c.TargetU <= 0 || c.TargetU > 1:
		return bad("target u %v must be in (0, 1]", c.TargetU)
	case !finite(c.HighU) || c.HighU < c.TargetU || c.HighU > 1:
		return bad("high u %v must be in [target u %v, 1]", c.HighU, c.TargetU)
	case !finite(c.HitWeight) || c.HitWeight <= 0 || c.HitWeight > 1:
		return bad("hit weight %v must be in (0, 1]", c.HitWeight)
	case !finite(c.HitMargin) || c.HitMargin >= 1:
		return bad("hit margin %v must be below 1", c.HitMargin)
	case !finite(c.HitFloor) || c.HitFloor >= 1:
		return bad("hit floor %v must be below 1", c.HitFloor)
	case c.MinWindow < 1 || c.MaxWindow < c.MinWindow:
		return bad("window bounds [%d, %d] must satisfy 1 <= min <= max", c.MinWindow, c.MaxWindow)
	case c.InitialWindow < c.MinWindow || c.InitialWindow > c.MaxWindow:
		return bad("initial window %d must be in [%d, %d]", c.InitialWindow, c.MinWindow, c.MaxWindow)
	}
	return nil
}

// Config configures a Registry. The zero rule, as in every kvmesh config: a zero field means
// its default (DefaultConfig's value), which New fills in; a setting that can be turned off is
// turned off by the negative value its documentation names, never by zero. So Config{} is the
// default configuration.
type Config struct {
	// MaxAgents bounds the registry. When it is full a new agent takes the place of the agent
	// idle longest (one not mid-step). Default 16384: about 3 MiB of bookkeeping.
	MaxAgents int `json:"max_agents"`
	// IdleTimeout: an agent with no step for this long leaves the window at the next Sweep.
	// Default 5m: longer than typical tool calls, shorter than an idle prefix survives in a
	// busy KV pool, so a window slot is not held for an agent whose cache is gone anyway.
	IdleTimeout time.Duration `json:"idle_timeout"`
	// StepTimeout: an agent mid-step for this long is presumed lost (its StepDone never came)
	// and leaves at the next Sweep, so a dropped boundary cannot hold a slot forever.
	// Default 15m, above any single generation.
	StepTimeout time.Duration `json:"step_timeout,advanced"`
	// Controller is the window rule applied to every home.
	Controller ControllerConfig `json:"controller,advanced"`
}

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{
		MaxAgents:   16384,
		IdleTimeout: 5 * time.Minute,
		StepTimeout: 15 * time.Minute,
		Controller:  DefaultControllerConfig(),
	}
}

// fill sets every zero field to its default (the zero rule), then validates.
func (c *Config) fill() error {
	d := DefaultConfig()
	if c.MaxAgents == 0 {
		c.MaxAgents = d.MaxAgents
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = d.IdleTimeout
	}
	if c.StepTimeout == 0 {
		c.StepTimeout = d.StepTimeout
	}
	if err := c.Controller.fill(); err != nil {
		return err
	}
	return c.validate()
}

func (c Config) validate() error {
	switch {
	case c.MaxAgents < 1:
		return fmt.Errorf("%w: max agents %d must be >= 1", ErrConfig, c.MaxAgents)
	case c.IdleTimeout <= 0:
		return fmt.Errorf("%w: idle timeout %v must be > 0", ErrConfig, c.IdleTimeout)
	case c.StepTimeout <= 0:
		return fmt.Errorf("%w: step timeout %v must be > 0", ErrConfig, c.StepTimeout)
	}
	return c.Controller.validate()
}

// Config returns the configuration in use, defaults filled.
func (a *Registry) Config() Config { return a.cfg }
