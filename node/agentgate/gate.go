package agentgate

import (
	"context"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/admit/agent"
)

// Gate keeps this node's agent window and the steps parked for it. mu guards home, wake,
// parked and context; reg is safe on its own.
type Gate struct {
	reg *agent.Registry

	mu      sync.Mutex
	home    *agent.Home
	wake    map[string]chan struct{} // agent → closed when its parked step may start
	parked  map[any]parked           // local steps parked for this node's window
	context map[any]int              // a step's context at its end (prompt + output), from Observe
	stop    chan struct{}            // closed by Stop (node shutdown)
	// demote, with the embedded engine, marks blocks as the first to evict: the prefix of an
	// agent the window no longer keeps goes before the prefixes of the agents it keeps. Nil
	// with an external engine.
	demote func([]uint64) int
}

// parked is a local step of an agent outside this node's window, parked in its handler.
type parked struct {
	id   string
	wake chan struct{}
}

// New returns the Gate of home, whose registry it reads. demote, when not nil, is handed the
// blocks the window no longer keeps.
func New(home *agent.Home, demote func([]uint64) int) *Gate {
	return &Gate{reg: home.Registry(), home: home, wake: map[string]chan struct{}{}, parked: map[any]parked{},
		context: map[any]int{}, stop: make(chan struct{}), demote: demote}
}

// Registry is the registry of the agents the gate's window knows.
func (g *Gate) Registry() *agent.Registry { return g.reg }

// WithHome runs f on the window with the gate's lock held.
func (g *Gate) WithHome(f func(*agent.Home)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	f(g.home)
}

// Arrive is the window's decision on step of agent id, a prompt of promptTokens: run reports
// whether the step may run now. When it may not and local is set (the step waits in this
// node's handler, not at a peer ingress), the step is parked until Wake closes its channel. A
// step that runs must be ended with Ran; err (agent.ErrFull: every registered agent is
// mid-step) lets it run unregistered.
func (g *Gate) Arrive(now time.Time, step any, id string, promptTokens int, local bool) (run bool, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	d, err := g.home.Arrive(now, id, promptTokens)
	if err == nil && d.Action == agent.Wait {
		if local {
			// A peer's step is parked at its ingress, which renews its lease; only a local one
			// is woken.
			if g.wake[id] == nil {
				g.wake[id] = make(chan struct{})
			}
			g.parked[step] = parked{id: id, wake: g.wake[id]}
		}
		g.wakeLocked()
		return false, nil
	}
	delete(g.parked, step)
	g.wakeLocked()
	return true, err
}

// Ran ends step of agent id, which Arrive let run: registered is false when Arrive returned an
// error (the step ran outside the window). final, the client's word that this was the agent's
// last step, gives its slot and the KV the window kept for it to the next agent now, whatever
// the step's outcome; blocks are the step's prompt blocks.
func (g *Gate) Ran(now time.Time, step any, id string, registered, final bool, blocks []uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	ctxTokens := g.context[step]
	delete(g.context, step)
	if !registered {
		return
	}
	g.demoteLocked(g.home.StepDone(now, id, ctxTokens, final, blocks))
	g.wakeLocked()
}

// Observe records a completed step's cache outcome (before Ran) for the recompute-avoided
// count, and its final context length.
func (g *Gate) Observe(step any, id string, cachedTokens, promptTokens, completionTokens int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.home.Observe(id, cachedTokens, promptTokens)
	g.context[step] = promptTokens + completionTokens
}

// Parked returns the agent and wake channel of step while it is parked here.
func (g *Gate) Parked(step any) (id string, wake <-chan struct{}, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	ps, ok := g.parked[step]
	return ps.id, ps.wake, ok
}

// Unpark stops tracking step as parked here.
func (g *Gate) Unpark(step any) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.parked, step)
}

// MayRun reports whether agent id is in the window, or gone from the registry: either way a
// step of it is decided again.
func (g *Gate) MayRun(id string) bool {
	ag, ok := g.reg.Get(id)
	return !ok || ag.State == agent.Active
}

// Pause waits until wake closes (nil: never), d passes, ctx ends or the gate stops.
func (g *Gate) Pause(ctx context.Context, wake <-chan struct{}, d time.Duration) {
	t := time.NewTimer(max(d, 0))
	defer t.Stop()
	select {
	case <-wake:
	case <-t.C:
	case <-ctx.Done():
	case <-g.stop:
	}
}

// Stop ends every wait of the gate (Pause, Renew); it is called once, when the node's control
// loop ends.
func (g *Gate) Stop() { close(g.stop) }

// Stopped reports whether Stop was called.
func (g *Gate) Stopped() bool {
	select {
	case <-g.stop:
		return true
	default:
		return false
	}
}

// Tick is one control interval (agent.Home.Tick) with the engine's state eng and the agents
// peers advertise being home to (elsewhere, by agent key), then the wake-ups it allows.
func (g *Gate) Tick(now time.Time, eng agent.Engine, elsewhere map[uint64][]string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	ids := make([]string, 0, len(g.parked))
	for _, ps := range g.parked {
		ids = append(ids, ps.id)
	}
	res := g.home.Tick(now, eng, ids, elsewhere)
	for _, id := range res.Released {
		// A step parked here for a released agent is woken and routed again, to the home
		// that keeps it.
		if ch := g.wake[id]; ch != nil {
			close(ch)
			delete(g.wake, id)
		}
	}
	g.demoteLocked(res.Demote)
	g.wakeLocked()
}

// Renew renews the home's lease on agent id's place for a step kept elsewhere (a peer
// ingress's, or this node's own in its waiting room) and returns the agent's state.
func (g *Gate) Renew(now time.Time, id string) agent.State {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.home.Renew(now, id)
}

// GiveUp abandons agent id, whose held step (step, when it was parked here; nil for a peer's)
// ended without running.
func (g *Gate) GiveUp(now time.Time, step any, id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if step != nil {
		delete(g.parked, step)
	}
	g.home.GiveUp(now, id)
	g.wakeLocked()
}

// RenewWait renews the lease of a parked step of id and, while the agent is outside the
// window, waits up to wait for it to be let in (or for ctx or the gate to end). It returns the
// agent's state then.
func (g *Gate) RenewWait(ctx context.Context, now time.Time, id string, wait time.Duration) agent.State {
	g.mu.Lock()
	st := g.home.Renew(now, id)
	if wait <= 0 || (st != agent.Waiting && st != agent.Paused) {
		g.mu.Unlock()
		return st
	}
	ch := g.wake[id]
	if ch == nil {
		ch = make(chan struct{})
		g.wake[id] = ch
	}
	g.mu.Unlock()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	case <-ctx.Done():
	case <-g.stop:
	}
	if ag, ok := g.reg.Get(id); ok {
		return ag.State
	}
	return agent.Absent
}

// LeaseStats is the window's count of agents abandoned by their ingress or their lease.
func (g *Gate) LeaseStats() agent.LeaseStats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.home.LeaseStats()
}

// ParseState parses agent.State's String; anything else is Absent.
func ParseState(s string) agent.State {
	for _, st := range []agent.State{agent.Waiting, agent.Active, agent.Paused} {
		if s == st.String() {
			return st
		}
	}
	return agent.Absent
}

// demoteLocked hands the engine the blocks the window no longer keeps.
func (g *Gate) demoteLocked(blocks []uint64) {
	if g.demote != nil && len(blocks) > 0 {
		g.demote(blocks)
	}
}

// wakeLocked releases the parked steps of the agents the window let in since the last call.
func (g *Gate) wakeLocked() {
	for _, id := range g.reg.Resumable() {
		if ch := g.wake[id]; ch != nil {
			close(ch)
			delete(g.wake, id)
		}
	}
	// An agent that left the registry (swept, evicted, abandoned) will never be resumed: its
	// parked step retries on its interval timer, so its channel can go.
	if len(g.wake) > 64 {
		for id := range g.wake {
			if _, ok := g.reg.Get(id); !ok {
				delete(g.wake, id)
			}
		}
	}
}
