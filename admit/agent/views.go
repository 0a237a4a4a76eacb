package agent

import "slices"

// Active returns the active agents of home, the most recently at a boundary first, so a node
// keeping prefixes under a bound keeps the likeliest to return soonest.
func (a *Registry) Active(homeName string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	h := a.homes[homeName]
	if h == nil {
		return nil
	}
	out := make([]string, 0, h.active.Len())
	for el := h.active.Back(); el != nil; el = el.Prev() {
		out = append(out, el.Value.(*entry).ID)
	}
	return out
}

// Homed returns how many agents home is home to (waiting, active or paused), and appends to
// dst the ids of at most max of them, the most recently at a boundary (arrival or step end)
// first: what a node advertises so that every ingress sends their steps to it.
func (a *Registry) Homed(homeName string, dst []string, max int) (int, []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	h := a.homes[homeName]
	if h == nil {
		return 0, dst
	}
	n := h.active.Len() + h.paused.Len() + h.waiting.Len()
	for el, k := a.lru.Back(), 0; el != nil && k < min(max, n); el = el.Prev() {
		if e := el.Value.(*entry); e.Home == homeName {
			dst = append(dst, e.ID)
			k++
		}
	}
	return n, dst
}

// Window returns home's current window (the initial window for a home not seen yet).
func (a *Registry) Window(homeName string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if h := a.homes[homeName]; h != nil {
		return h.ctl.Window()
	}
	return a.cfg.Controller.InitialWindow
}

// Get returns a snapshot of id.
func (a *Registry) Get(id string) (Agent, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if e := a.agents[id]; e != nil {
		return e.Agent, true
	}
	return Agent{}, false
}

// HomeStats is one home's window and agents.
type HomeStats struct {
	Home                    string
	Active, Paused, Waiting int
	Controller              ControllerStats // Window, and the last U and H it saw
}

// Stats is what the node exports as kvmesh_agent_* metrics.
type Stats struct {
	Agents, Active, Paused, Waiting, InStep int
	AdmittedTotal                           uint64 // agents that entered the window for the first time
	PausesTotal, ResumesTotal               uint64
	EvictedTotal, SweptTotal, FinishedTotal uint64
	ReleasedTotal                           uint64 // agents let go to another home (Release)
	RecomputeAvoidedTokens                  uint64 // see Observe
	RecomputedTokens                        uint64
	// KeptAvoidedTokens and KeptRecomputedTokens are the part of the two above from agents
	// that stayed in the window since their previous step: the context the window means to
	// keep. Their ratio is the hit rate to feed Tick; an agent that was paused is expected to
	// lose its prefix, and counting that would make each cut look like more thrashing.
	KeptAvoidedTokens, KeptRecomputedTokens uint64
	// GrowthTokens is how much an agent's prompt grows from one step to the next (its output
	// plus the tool result), a moving average over every agent's steps; 0 before any agent's
	// second step. An active agent's next step needs this much more KV than its last.
	GrowthTokens float64
	// FootprintTokens is an agent's footprint, its mean context at the ends of its steps, as a
	// moving average over agents that ended (weight 0.1); 0 until one has. Over the pool's size
	// it is Signals.Footprint.
	FootprintTokens float64
	Homes           []HomeStats // sorted by Home
}

// Stats returns current counts and totals.
func (a *Registry) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := Stats{Agents: len(a.agents), InStep: a.inStep, AdmittedTotal: a.admitted,
		PausesTotal: a.pauses, ResumesTotal: a.resumes, EvictedTotal: a.evicted,
		SweptTotal: a.swept, FinishedTotal: a.finished, ReleasedTotal: a.released,
		RecomputeAvoidedTokens: a.avoided, RecomputedTokens: a.recomputed,
		KeptAvoidedTokens: a.keptAvoided, KeptRecomputedTokens: a.keptRecomputed, GrowthTokens: a.growth,
		FootprintTokens: a.footprintLocked()}
	for name, h := range a.homes {
		hs := HomeStats{Home: name, Active: h.active.Len(), Paused: h.paused.Len(),
			Waiting: h.waiting.Len(), Controller: h.ctl.Stats()}
		s.Active += hs.Active
		s.Paused += hs.Paused
		s.Waiting += hs.Waiting
		s.Homes = append(s.Homes, hs)
	}
	slices.SortFunc(s.Homes, func(x, y HomeStats) int {
		if x.Home < y.Home {
			return -1
		}
		if x.Home > y.Home {
			return 1
		}
		return 0
	})
	return s
}
