package agent

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// HomeConfig configures a Home. A zero field takes DefaultHomeConfig's value, except Name,
// which is required, and Key and Preferred, which are optional.
type HomeConfig struct {
	// Name is this node's name: the one home of the Registry this Home tends.
	Name string
	// Interval is the control interval (Tick's period).
	Interval time.Duration
	// LeaseIntervals is how many intervals a parked step's lease lasts without a renewal: an
	// ingress that stopped renewing (it crashed, or its give-up was lost) gave the step up,
	// and the agent must not keep its place, or a slot it was let into for that step.
	LeaseIntervals int
	// Key maps an agent id to the key peers advertise it by, and Preferred picks, of several
	// nodes that register the same agent, the one that keeps it. Both nil: an agent registered
	// at two homes stays at both until its idle timeout.
	Key       func(id string) uint64
	Preferred func(id string, homes []string) string
}

// DefaultHomeConfig returns a 500 ms interval and a lease of 5 intervals.
func DefaultHomeConfig() HomeConfig {
	return HomeConfig{Interval: 500 * time.Millisecond, LeaseIntervals: 5}
}

// Home is the part of agent-level admission that belongs to one home node: its window's
// agents in the Registry, the leases of steps parked at ingresses while their agent is
// outside the window, the prompt prefixes of the active agents the window means to keep, and
// the controller's signals, computed from the engine's state each Tick.
//
// A Home is not safe for concurrent use: its node serializes the calls (the Registry it
// wraps is safe on its own, for readers such as metrics).
type Home struct {
	cfg HomeConfig
	reg *Registry

	// asked is when a parked step of an agent outside the window last asked (arrived or was
	// renewed): the lease it keeps.
	asked map[string]time.Time
	// prefix is the prompt blocks of each active agent's last step: what the window keeps.
	prefix map[string][]uint64
	// The recompute counters at the last tick, and the hit rate H they gave.
	lastAvoided, lastRecomputed uint64
	h                           float64
	// Agents abandoned because the lease of their parked step ran out, or because its
	// ingress gave it up.
	leaseExpired, givenUp uint64
}

// ErrHomeConfig reports an invalid HomeConfig.
var ErrHomeConfig = errors.New("agent: invalid home config")

// NewHome returns the Home named cfg.Name over reg. It does no I/O.
func NewHome(cfg HomeConfig, reg *Registry) (*Home, error) {
	def := DefaultHomeConfig()
	if cfg.Interval <= 0 {
		cfg.Interval = def.Interval
	}
	if cfg.LeaseIntervals <= 0 {
		cfg.LeaseIntervals = def.LeaseIntervals
	}
	if cfg.Name == "" || reg == nil {
		return nil, fmt.Errorf("agent: a home needs a name and a registry: %w", ErrHomeConfig)
	}
	return &Home{cfg: cfg, reg: reg, asked: map[string]time.Time{}, prefix: map[string][]uint64{}, h: 1}, nil
}

// Registry returns the registry the Home tends.
func (h *Home) Registry() *Registry { return h.reg }

// Arrive registers a step of agent id with promptTokens at this home: Admit runs it, Wait
// parks it at its ingress, whose lease on the agent's place starts now. The error is the
// Registry's (ErrFull: run the step unprotected).
func (h *Home) Arrive(now time.Time, id string, promptTokens int) (Decision, error) {
	d, err := h.reg.Arrive(now, id, h.cfg.Name, promptTokens)
	if err != nil {
		delete(h.asked, id)
		return d, err
	}
	if d.Evicted != "" {
		delete(h.prefix, d.Evicted)
		delete(h.asked, d.Evicted)
	}
	if d.Action == Wait {
		h.asked[id] = now
	} else {
		delete(h.asked, id)
	}
	return d, nil
}

// StepDone ends a step of id whose context (prompt and output) was contextTokens and whose
// prompt hashed to blocks; final ends the agent (its client said so). It returns the blocks to
// demote in the engine's cache: the prefix of an agent the window no longer keeps, except
// blocks an active agent's prefix shares.
func (h *Home) StepDone(now time.Time, id string, contextTokens int, final bool, blocks []uint64) []uint64 {
	st := h.reg.StepDone(now, id, contextTokens)
	if final {
		h.reg.Finish(now, id)
		st = Absent
	}
	if st == Active {
		h.prefix[id] = blocks
		return nil
	}
	delete(h.prefix, id)
	return h.unkept(blocks)
}

// Observe records a completed step's cache outcome (cached of prompt tokens).
func (h *Home) Observe(id string, cachedTokens, promptTokens int) {
	h.reg.Observe(id, cachedTokens, promptTokens)
}

// Renew renews the lease of a parked step of id that an ingress (this node or a peer) still
// holds, and returns the agent's state. A step waiting for the window is a step boundary that
// has arrived, not silence: it refreshes the agent, so neither the lease nor the idle sweep
// drops it and its place in the queue. An agent let into the window for such a step keeps
// that slot while the step waits at its ingress for KV room. An agent active on its own
// account holds no lease.
func (h *Home) Renew(now time.Time, id string) State {
	ag, ok := h.reg.Get(id)
	switch {
	case !ok:
		return Absent
	case ag.State != Active:
		_, _ = h.reg.Arrive(now, id, h.cfg.Name, 0)
		h.asked[id] = now
	default:
		if _, leased := h.asked[id]; leased {
			h.asked[id] = now
		}
	}
	return ag.State
}

// GiveUp abandons id, whose parked step its ingress gave up (queue TTL, client gone, drain).
func (h *Home) GiveUp(now time.Time, id string) { h.abandon(now, id, false) }

func (h *Home) abandon(now time.Time, id string, lease bool) {
	delete(h.asked, id)
	if !h.reg.Abandon(now, id) {
		return
	}
	if lease {
		h.leaseExpired++
	} else {
		h.givenUp++
	}
}

// Engine is what a Tick needs of the engine's state.
type Engine struct {
	KVBlocksTotal, KVBlocksUsed, BlockTokens int
}

// TickResult is what a Tick asks the node to do.
type TickResult struct {
	// Released are agents let go to a peer that keeps them: wake their parked steps here, to
	// be routed again.
	Released []string
	// Demote are blocks the window no longer keeps (engine.Demote).
	Demote []uint64
}

// Tick is one control interval at now: it renews the leases of the steps parked at this node
// (parked), lets go of agents that a preferred peer registers too (elsewhere: by Key, the
// peers advertising the agent), feeds the controller its signals, abandons parked steps whose
// lease ran out, sweeps silent agents and forgets the prefixes of agents no longer active.
func (h *Home) Tick(now time.Time, eng Engine, parked []string, elsewhere map[uint64][]string) TickResult {
	var res TickResult
	res.Released = h.releaseElsewhere(now, elsewhere, &res.Demote)
	h.reg.TickSignals(now, h.cfg.Name, h.signals(eng))
	here := make(map[string]bool, len(parked))
	for _, id := range parked {
		here[id] = true
		h.Renew(now, id)
	}
	lease := time.Duration(h.cfg.LeaseIntervals) * h.cfg.Interval
	for id, at := range h.asked {
		if now.Sub(at) > lease && !here[id] {
			h.abandon(now, id, true)
		}
	}
	h.reg.Sweep(now)
	active := map[string]bool{}
	for _, id := range h.reg.Active(h.cfg.Name) {
		active[id] = true
	}
	var gone [][]uint64
	for id, bs := range h.prefix {
		if !active[id] {
			delete(h.prefix, id)
			gone = append(gone, bs)
		}
	}
	for _, bs := range gone {
		res.Demote = append(res.Demote, h.unkept(bs)...)
	}
	return res
}

// releaseElsewhere lets go of the agents this node is home to that other peers advertise
// too, when one of those peers, not this node, is Preferred of them all. An agent gets two
// homes when its next step reaches another ingress before gossip says where it lives, and
// both register it; every ingress then sends its steps to the preferred home, so the other
// would hold a window slot (or a place in the queue) for an agent whose steps no longer come.
// Each other home releases it at its first tick with the agent between steps, so exactly one
// keeps it. It returns the released agents and appends their prefixes' blocks to demote.
func (h *Home) releaseElsewhere(now time.Time, elsewhere map[uint64][]string, demote *[]uint64) []string {
	if len(elsewhere) == 0 || h.cfg.Key == nil || h.cfg.Preferred == nil {
		return nil
	}
	var released []string
	_, ids := h.reg.Homed(h.cfg.Name, nil, math.MaxInt)
	for _, id := range ids {
		peers := elsewhere[h.cfg.Key(id)]
		if len(peers) == 0 || h.cfg.Preferred(id, append(peers[:len(peers):len(peers)], h.cfg.Name)) == h.cfg.Name {
			continue
		}
		if !h.reg.Release(now, id) {
			continue // mid-step: asked again at the next tick
		}
		delete(h.asked, id)
		if bs, ok := h.prefix[id]; ok {
			delete(h.prefix, id)
			*demote = append(*demote, h.unkept(bs)...)
		}
		released = append(released, id)
	}
	return released
}

// unkept returns the blocks of a prefix the window no longer keeps, less those an active
// agent's prefix shares. An LRU cache alone would keep a finished agent's context, used a
// moment ago, over the context of an active agent waiting for a tool, and evict the wrong one
// when the pool is full.
func (h *Home) unkept(blocks []uint64) []uint64 {
	if len(blocks) == 0 {
		return nil
	}
	kept := map[uint64]bool{}
	for _, bs := range h.prefix {
		for _, b := range bs {
			kept[b] = true
		}
	}
	var out []uint64
	for _, b := range blocks {
		if !kept[b] {
			out = append(out, b)
		}
	}
	return out
}

// signals computes the window controller's signals from the engine's state.
//
// H is the hit rate on the agents' own earlier context over the last interval: of the tokens
// the agents had already computed (their context at the end of their previous step), the share
// their next step found in the prefix cache; only agents that stayed in the window since their
// previous step count (a paused agent is expected to lose its prefix). With no agent step in
// the interval H keeps its last value.
//
// U is the share of the KV pool the window needs: the engine's KV use plus the blocks of the
// active agents' prefixes that no running step holds (an engine counts an idle cached prefix
// as free, because it may evict it; the window means to keep it).
//
// Next is U plus, for every active agent, the blocks its prompt grows by from one step to the
// next (the moving average GrowthTokens): the share the window needs at its agents' next
// steps.
func (h *Home) signals(eng Engine) Signals {
	s := h.reg.Stats()
	avoided, recomputed := s.KeptAvoidedTokens-h.lastAvoided, s.KeptRecomputedTokens-h.lastRecomputed
	h.lastAvoided, h.lastRecomputed = s.KeptAvoidedTokens, s.KeptRecomputedTokens
	if avoided+recomputed > 0 {
		h.h = float64(avoided) / float64(avoided+recomputed)
	}
	if eng.KVBlocksTotal <= 0 {
		return Signals{U: math.NaN(), H: h.h} // no engine state yet: the controller skips the tick
	}
	running := map[uint64]bool{}
	var idle [][]uint64
	active := h.reg.Active(h.cfg.Name)
	for _, id := range active {
		ag, _ := h.reg.Get(id)
		if ag.InStep {
			for _, b := range h.prefix[id] {
				running[b] = true
			}
		} else {
			idle = append(idle, h.prefix[id])
		}
	}
	protected := map[uint64]bool{}
	for _, bs := range idle {
		for _, b := range bs {
			if !running[b] {
				protected[b] = true
			}
		}
	}
	growth := 0
	if bt := max(eng.BlockTokens, 1); s.GrowthTokens > 0 {
		growth = len(active) * int(math.Ceil(s.GrowthTokens/float64(bt)))
	}
	total := float64(eng.KVBlocksTotal)
	now := float64(eng.KVBlocksUsed + len(protected))
	return Signals{U: now / total, Next: (now + float64(growth)) / total, H: h.h, PoolTokens: eng.KVBlocksTotal * eng.BlockTokens}
}

// LeaseStats are a Home's counters of abandoned parked steps.
type LeaseStats struct {
	// Abandoned agents whose parked step's ingress gave it up, or whose lease ran out.
	GivenUp, LeaseExpired uint64
}

// LeaseStats returns the Home's counters of abandoned parked steps.
func (h *Home) LeaseStats() LeaseStats {
	return LeaseStats{GivenUp: h.givenUp, LeaseExpired: h.leaseExpired}
}
