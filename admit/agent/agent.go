package agent

import (
	"container/list"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"
)

var (
	// ErrFull: the registry holds MaxAgents agents and every one of them is mid-step, so none
	// can leave to make room. The node answers 429.
	ErrFull = errors.New("agent: registry full of agents mid-step")
	// ErrInvalid: an empty agent id, or a new agent without a home.
	ErrInvalid = errors.New("agent: invalid argument")
)

// Scoped is the id an agent is known by in the mesh (its window, leases and home): the
// client's id scoped to the client's tenant, so that two tenants who pick the same id run two
// agents and neither can end, pause or take the window slot of the other's. The tenant comes
// first as 16 hex digits of its SHA-256: of fixed length, so that no other tenant and id give
// the same string, and without the tenant's name, which ids travel in gossip and traces.
func Scoped(tenant, id string) string {
	h := sha256.Sum256([]byte(tenant))
	return hex.EncodeToString(h[:8]) + "/" + id
}

// ScopeBytes is what Scoped adds to an id.
const ScopeBytes = 2*8 + 1

// State is where an agent stands relative to its home's window.
type State uint8

const (
	Absent  State = iota // not in the registry
	Waiting              // new, its first step held until the window has room
	Active               // in the window: its steps are admitted and its prefix protected
	Paused               // was active, taken out at a step boundary; its next step waits
)

func (s State) String() string {
	switch s {
	case Waiting:
		return "waiting"
	case Active:
		return "active"
	case Paused:
		return "paused"
	default:
		return "absent"
	}
}

// Agent is a snapshot of one agent's bookkeeping.
type Agent struct {
	ID            string
	Home          string    // node whose KV holds the agent's prefix; every step routes there
	ContextTokens int       // the latest context length seen (at arrival or step end)
	Steps         int       // completed steps
	LastStep      time.Time // the last boundary: a step's arrival or its end
	State         State
	InStep        bool      // a step is generating; an agent in step is never paused
	Pending       bool      // a step is held in the node's waiting room for this agent
	PausedAt      time.Time // when it was paused; zero unless Paused
	CachedTokens  int64     // prompt tokens served from cache, over all Observe calls
	PromptTokens  int64     // prompt tokens, over all Observe calls
}

// Action is the verdict on a step.
type Action uint8

const (
	// Admit: run the step now, routed to Decision.Home. Either the agent is active (its step is
	// part of the agent and pays no new admission cost) or it is new and the window had room.
	Admit Action = iota + 1
	// Wait: hold the step in the waiting room until Resumable lists the agent (or CanStart
	// turns true), then call Arrive again. A new agent with no room, or a paused one.
	Wait
)

func (a Action) String() string {
	switch a {
	case Admit:
		return "admit"
	case Wait:
		return "wait"
	default:
		return "invalid"
	}
}

// Decision is Arrive's answer.
type Decision struct {
	Action Action
	Home   string // where the agent's prefix lives: route the step here
	New    bool   // the agent was not known before this step
	// Evicted names an agent removed from the full registry to make room for this one (the
	// idle longest); a step the node holds for it will never be listed by Resumable.
	Evicted string
}

type entry struct {
	Agent
	inflight int   // steps admitted and not yet done
	prompt   int   // the prompt of its latest step, to measure the next one's growth
	reusable int   // context at the end of the last step: what a cache could give back
	held     int64 // its contexts at the ends of its steps, summed (their mean is its footprint)
	lru      *list.Element
	slot     *list.Element // in its home's active, paused or waiting list
	ready    bool          // listed in Registry.ready, not yet handed out
	granted  bool          // let into the window for a held step that has not arrived again yet
	kept     bool          // active without a break since its last step ended
}

type home struct {
	ctl                     *Controller
	active, paused, waiting list.List // active: least recently at a boundary first; others FIFO
}

func (h *home) listOf(s State) *list.List {
	switch s {
	case Active:
		return &h.active
	case Paused:
		return &h.paused
	case Waiting:
		return &h.waiting
	}
	return nil
}

// Registry is the registry of agents and the windows of their home nodes. Build it with New;
// all methods are safe for concurrent use.
type Registry struct {
	cfg Config

	mu     sync.Mutex
	agents map[string]*entry
	lru    list.List // every agent, least recent LastStep first
	homes  map[string]*home
	ready  []string
	inStep int

	admitted, pauses, resumes, evicted, swept, finished uint64
	released                                            uint64
	avoided, recomputed                                 uint64
	keptAvoided, keptRecomputed                         uint64
	growth                                              float64 // EWMA of a step's prompt growth, tokens
	pool                                                float64 // KV pool size in tokens, from the last tick; 0 unknown
	heldAvg, stepsAvg                                   float64 // EWMAs over ended agents of their summed step-end contexts and of their steps
	ended                                               int     // agents in those averages
	grown                                               bool    // growth has a sample
}

// growthWeight is the weight of a new sample in the EWMA of how much an agent's prompt grows
// from one step to the next (its last output plus the tool result). 0.1: tool results vary
// several-fold from step to step, so the mean of the last ten or so is what predicts the next.
const growthWeight = 0.1

// New fills cfg's zero fields with their defaults, validates it and returns an empty Registry.
// It does no I/O and starts nothing.
func New(cfg Config) (*Registry, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	return &Registry{cfg: cfg, agents: make(map[string]*entry), homes: make(map[string]*home)}, nil
}

// Arrive is called when a step of agent id arrives, at a step boundary. home is where routing
// would place a new agent; a known agent keeps the home it has, which Decision.Home returns.
// contextTokens is the step's prompt length (0: unknown, keep the last).
func (a *Registry) Arrive(now time.Time, id, homeName string, contextTokens int) (Decision, error) {
	if id == "" {
		return Decision{}, fmt.Errorf("%w: empty agent id", ErrInvalid)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.agents[id]
	if e != nil {
		if contextTokens > 0 {
			e.ContextTokens = contextTokens
			a.growLocked(e, contextTokens)
		}
		a.touchLocked(e, now)
		if e.State == Active {
			e.granted = false
			a.setInflightLocked(e, e.inflight+1)
			return Decision{Action: Admit, Home: e.Home}, nil
		}
		e.Pending = true
		return Decision{Action: Wait, Home: e.Home}, nil
	}
	if homeName == "" {
		return Decision{}, fmt.Errorf("%w: new agent %q without a home", ErrInvalid, id)
	}
	d := Decision{Home: homeName, New: true}
	if len(a.agents) >= a.cfg.MaxAgents {
		victim := a.victimLocked()
		if victim == nil {
			return Decision{}, ErrFull
		}
		d.Evicted = victim.ID
		a.evicted++
		a.removeLocked(victim, now)
	}
	h := a.homeLocked(homeName)
	e = &entry{Agent: Agent{ID: id, Home: homeName, ContextTokens: max(contextTokens, 0), LastStep: now},
		prompt: max(contextTokens, 0)}
	e.lru = a.lru.PushBack(e)
	a.agents[id] = e
	a.fillLocked(h, now) // no one queued ahead may be overtaken
	if h.active.Len() < h.ctl.Window() {
		a.setStateLocked(h, e, Active, now)
		h.ctl.Joined(a.shareLocked(e))
		a.setInflightLocked(e, 1)
		a.admitted++
		d.Action = Admit
		return d, nil
	}
	a.setStateLocked(h, e, Waiting, now)
	e.Pending = true
	d.Action = Wait
	return d, nil
}

// StepDone is called when a step of id ended (the boundary) with the agent's context now
// contextTokens long (prompt plus output; 0: unknown). This is where pauses of agents that were
// mid-step take effect: if the home's window is smaller than its active agents, the agent is
// paused here. It returns the agent's state after the boundary (Absent if unknown); Paused
// tells the node the agent's prefix is no longer the window's to keep.
func (a *Registry) StepDone(now time.Time, id string, contextTokens int) State {
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.agents[id]
	if e == nil {
		return Absent
	}
	if e.inflight == 0 {
		return e.State // a duplicate or stray boundary: nothing was running
	}
	a.setInflightLocked(e, e.inflight-1)
	e.Steps++
	if contextTokens > 0 {
		e.ContextTokens = contextTokens
	}
	e.reusable = e.ContextTokens
	e.held += int64(e.ContextTokens)
	a.touchLocked(e, now)
	if e.State == Active {
		a.enforceLocked(a.homes[e.Home], now)
	}
	e.kept = e.State == Active
	return e.State
}

// Abandon is called when the step the node held for id left without running (its TTL
// expired, the client went away, its ingress stopped asking). The agent leaves the registry
// unless it is active on its own account (let in before this step was held): a waiting agent
// never ran, a paused one would be resumed into a slot for a step that is not coming, and one
// let in for this very step would hold that slot until the idle timeout. Its slot goes to the
// next agent. If the client comes back, its step arrives as a new agent's. It reports
// whether the agent left.
func (a *Registry) Abandon(now time.Time, id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.agents[id]
	if e == nil {
		return false
	}
	e.Pending, e.ready = false, false
	if e.State == Active && (!e.granted || e.InStep) {
		e.granted = false
		return false
	}
	a.removeLocked(e, now)
	return true
}

// Release removes id if it is not mid-step, and reports whether it did: the agent is homed
// elsewhere too (two ingresses registered it before gossip said where it lives), and the
// other home keeps it. Its slot, or its place in the queue, goes to the next agent; a step
// held for it is not listed by Resumable and must be routed again.
func (a *Registry) Release(now time.Time, id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.agents[id]
	if e == nil || e.InStep {
		return false
	}
	a.released++
	a.removeLocked(e, now)
	return true
}

// Finish removes id (the agent is done) and gives its slot to the next agent. It reports
// whether id was known.
func (a *Registry) Finish(now time.Time, id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.agents[id]
	if e == nil {
		return false
	}
	a.finished++
	a.learnFootprintLocked(e)
	a.removeLocked(e, now)
	return true
}

// Sweep removes agents silent for longer than IdleTimeout, and agents mid-step for longer than
// StepTimeout (a lost boundary), and returns their ids so the node can drop their state and
// any held step.
func (a *Registry) Sweep(now time.Time) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	idleCut, stepCut := now.Add(-a.cfg.IdleTimeout), now.Add(-a.cfg.StepTimeout)
	var out []string
	for el := a.lru.Front(); el != nil; {
		e := el.Value.(*entry)
		el = el.Next()
		if !e.LastStep.Before(idleCut) {
			break // the list is in LastStep order: everyone after is fresher
		}
		if e.InStep && !e.LastStep.Before(stepCut) {
			continue
		}
		out = append(out, e.ID)
		a.swept++
		if !e.InStep {
			a.learnFootprintLocked(e) // gone silent: its session ended without saying so
		}
		a.removeLocked(e, now)
	}
	return out
}

// Tick feeds one control interval's signals of home (KV use u and prefix hit rate h, 0..1) to
// its window controller, then applies the new window: idle active agents beyond it are paused
// now (they are between steps), agents mid-step beyond it are paused at their StepDone, and
// room is given to paused agents (longest paused first) and then to waiting ones (first come
// first). It returns the window.
func (a *Registry) Tick(now time.Time, homeName string, u, h float64) int {
	return a.TickSignals(now, homeName, Signals{U: u, H: h})
}

// TickSignals is Tick with the predicted KV use s.Next (see Signals). The demand and the
// active count are the home's; s.Demand and s.Active are ignored.
func (a *Registry) TickSignals(now time.Time, homeName string, s Signals) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	hm := a.homeLocked(homeName)
	s.Demand = hm.active.Len() + hm.paused.Len() + hm.waiting.Len()
	s.Active = hm.active.Len()
	if s.PoolTokens > 0 {
		a.pool = float64(s.PoolTokens)
	}
	if f := a.footprintLocked(); a.pool > 0 && f > 0 {
		// The first agents to end are the shortest sessions, with the smallest contexts: the
		// footprint counts once as many agents have ended as it would let into the window.
		if share := f / a.pool; float64(a.ended) >= a.cfg.Controller.HighU/share {
			s.Footprint = share
		}
	}
	w, _ := hm.ctl.TickSignals(now, s)
	a.enforceLocked(hm, now)
	a.fillLocked(hm, now)
	return w
}

// Resumable returns, once each, the agents whose held step may now start because they entered
// the window (room grew, an agent left, or a paused agent resumed), longest paused first, then
// new agents in arrival order. The node releases each one's held step by calling Arrive again,
// which now answers Admit.
func (a *Registry) Resumable() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, id := range a.ready {
		e := a.agents[id]
		if e == nil || !e.ready {
			continue
		}
		e.ready = false
		if e.State == Active {
			out = append(out, id)
		}
	}
	a.ready = a.ready[:0]
	return out
}

// CanStart reports whether a step of id would be admitted now (the agent is active); the
// node's waiting room can use it as its can-run test.
func (a *Registry) CanStart(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.agents[id]
	return e != nil && e.State == Active
}

// Observe records a step's cache outcome: of promptTokens, cachedTokens came from the prefix
// cache. Call it before that step's StepDone. The part of the prompt the agent had already
// computed (its context at the end of its previous step) is what agent admission protects: of
// it, the cached tokens are recompute avoided and the rest was recomputed. Both are returned
// and added to Stats. An unknown agent counts nothing.
func (a *Registry) Observe(id string, cachedTokens, promptTokens int) (avoided, recomputed int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.agents[id]
	if e == nil || promptTokens <= 0 {
		return 0, 0
	}
	cachedTokens = min(max(cachedTokens, 0), promptTokens)
	reuse := min(e.reusable, promptTokens)
	avoided = min(cachedTokens, reuse)
	recomputed = reuse - avoided
	e.CachedTokens += int64(cachedTokens)
	e.PromptTokens += int64(promptTokens)
	a.avoided += uint64(avoided)
	a.recomputed += uint64(recomputed)
	if e.kept {
		a.keptAvoided += uint64(avoided)
		a.keptRecomputed += uint64(recomputed)
	}
	return avoided, recomputed
}

// ForgetHome drops home (a node that left the mesh) with its window and every agent homed
// there, whose prefixes left with it, and returns those agents' ids so the node can fail any
// step it holds for them. Their next steps arrive as new agents and are routed afresh.
func (a *Registry) ForgetHome(now time.Time, homeName string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	h := a.homes[homeName]
	if h == nil {
		return nil
	}
	var out []string
	for _, l := range []*list.List{&h.active, &h.paused, &h.waiting} {
		for el := l.Front(); el != nil; el = l.Front() {
			e := el.Value.(*entry)
			out = append(out, e.ID)
			a.removeLockedFrom(l, e)
		}
	}
	delete(a.homes, homeName)
	return out
}
