package node

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/agent"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/transport"
)

// CodeAgentPaused is an owner's refusal of an agent step whose agent is outside its window
// (paused, or new and waiting for a slot). The ingress holds the step and retries it at the
// same owner; the client never sees this code unless the step's queue TTL runs out.
const CodeAgentPaused = "agent_paused"

// DefaultAgentInterval is the agent window's control interval when Config.AgentInterval is 0.
const DefaultAgentInterval = 500 * time.Millisecond

// HeaderAgentFinal, set to 1 on an agent's last step, ends the agent at its home once that
// step is done, so its window slot goes to the next agent at once instead of after the idle
// timeout.
const HeaderAgentFinal = "X-Kvmesh-Agent-Final"

// agentLeaseIntervals is how many control intervals a step held for this node's window may go
// without its ingress renewing the hold before the window gives up on it: an ingress that
// stopped renewing (it crashed, or its give-up was lost) gave the step up, and the agent must
// not keep its place, or a slot it was let into for that step. The ingress renews every
// interval for as long as it holds the step, whether it waits for the window or, let in, for
// KV room in its waiting room, and gives the step up explicitly when it ends without running.
const agentLeaseIntervals = 5

// The agent-lease messages an ingress sends the home whose window holds one of its steps: a
// forward of kind transport.KindAgentHold or KindAgentGiveUp with the agent in AgentID and an
// empty body, answered with an accept carrying the agent's state (agent.State's String) in
// headerAgentState. A hold says the ingress still holds a step of the agent: the home renews
// its lease and, if the agent is outside the window, waits up to HoldWait (at most an
// interval) for it to be let in before it answers, so the ingress learns of a free slot at
// once without sending the step's body again and again. A give-up says the step ended without
// running (queue TTL, client gone, drain): the home abandons the agent now rather than when
// the lease runs out. A node that does not know the kinds refuses them, and the ingress routes
// the step again each interval.
const headerAgentState = "X-Kvmesh-Agent-State"

// agentGate is the node's side of agent-level admission: this node is the home of every agent
// whose steps run on its engine, so it owns their window (agent.Admitter), feeds it the
// engine's signals, and wakes the ingress handlers holding a step of an agent that re-entered
// the window. It does not pin prefixes: the window is sized so that the active agents'
// prefixes stay in an LRU cache on their own, and if they do not, the falling hit rate is the
// signal to cut (a pin would hide it and push the running sequences into preemption). All
// fields are guarded by mu.
type agentGate struct {
	a    *agent.Admitter
	home string // this node's name: the only home its Admitter knows

	mu      sync.Mutex
	wake    map[string]chan struct{} // agent → closed when its held step may start
	held    map[*prepared]heldStep   // steps held for this node's window
	context map[*prepared]int        // a step's context at its end (prompt + output), from finished
	stop    chan struct{}            // closed when the control loop ends (node shutdown)
	// asked is when a step of an agent outside the window last asked (arrived or retried):
	// the lease a held step keeps; see agentLeaseIntervals.
	asked map[string]time.Time
	// prefix is the prompt blocks of each active agent's last step: what the window protects,
	// counted in U.
	prefix map[string][]uint64
	// demote, with the embedded engine, marks blocks as the first to evict (sim.Demote): the
	// prefix of an agent the window no longer keeps (finished, paused, gone) goes before the
	// prefixes of the agents it keeps. Nil with an external engine.
	demote func([]uint64) int
	// The recompute counters at the last tick, and the hit rate H they gave.
	lastAvoided, lastRecomputed uint64
	h                           float64
	// Agents abandoned because the lease of their held step ran out, or because its ingress
	// gave it up.
	leaseExpired, givenUp uint64
}

// heldStep is a step of an agent outside this node's window, held by its ingress handler.
type heldStep struct {
	id   string
	wake chan struct{}
}

// agentHold is the home whose agent window holds a step, kept by the ingress while the step
// waits, so that it renews the home's lease on the agent's place and tells the home when it
// gives the step up. The zero value: no window holds the step.
type agentHold struct {
	home string // the home's node name
	addr string // its QUIC address; unused when the home is this node
}

// buildAgents sets up agent admission when cfg.Agents is set. It does no I/O.
func (n *Node) buildAgents() error {
	if n.cfg.AgentInterval <= 0 {
		n.cfg.AgentInterval = DefaultAgentInterval
	}
	if n.cfg.Agents == nil {
		return nil
	}
	a, err := agent.New(*n.cfg.Agents)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	n.agents = &agentGate{a: a, home: n.cfg.Name, wake: map[string]chan struct{}{},
		held: map[*prepared]heldStep{}, context: map[*prepared]int{}, stop: make(chan struct{}),
		asked: map[string]time.Time{}, prefix: map[string][]uint64{}, h: 1}
	if n.sim != nil {
		n.agents.demote = n.sim.Demote
	}
	n.reg.MustRegister(newAgentCollector(n.agents))
	return nil
}

// agentStep is what the local serving path does with an agent step: run it (serveLocal with
// the window's bookkeeping around it) or, when the agent is outside the window, report held
// so the caller answers "wait". Requests without an agent, or with agent admission off, run.
func (n *Node) agentStep(ctx context.Context, w http.ResponseWriter, p *prepared, start time.Time, origin string) (outcome, bool) {
	g := n.agents
	if g == nil || p.adm.Agent == "" {
		return n.serveLocal(ctx, w, p, start, origin), true
	}
	id := p.adm.Agent
	now := time.Now()
	g.mu.Lock()
	d, err := g.a.Arrive(now, id, g.home, p.adm.PromptTokens)
	if err == nil && d.Evicted != "" {
		delete(g.prefix, d.Evicted)
	}
	if err == nil && d.Action == agent.Wait {
		g.asked[id] = now
		if origin == "local" {
			// A peer's step is held by its ingress, which sends holds; only a local one is woken.
			if g.wake[id] == nil {
				g.wake[id] = make(chan struct{})
			}
			g.held[p] = heldStep{id: id, wake: g.wake[id]}
		}
		g.wakeLocked()
		g.mu.Unlock()
		return outcome{}, false
	}
	delete(g.held, p)
	delete(g.asked, id)
	g.wakeLocked()
	g.mu.Unlock()
	if err != nil {
		// ErrFull: every registered agent is mid-step; run the step unprotected rather than
		// fail it, as request-level admission already accepted it.
		n.log.Debug("agent registry", "agent", id, "err", err)
		o := n.serveLocal(ctx, w, p, start, origin)
		g.mu.Lock()
		delete(g.context, p)
		g.mu.Unlock()
		return o, true
	}
	o := n.serveLocal(ctx, w, p, start, origin)
	g.mu.Lock()
	ctxTokens := g.context[p]
	delete(g.context, p)
	now = time.Now()
	st := g.a.StepDone(now, id, ctxTokens)
	if p.agentFinal {
		// The client said this was the agent's last step, whatever its outcome: the slot and
		// the KV the window kept for it go to the next agent now.
		g.a.Finish(now, id)
		st = agent.Absent
	}
	if st == agent.Active {
		g.prefix[id] = p.req.Blocks
	} else {
		delete(g.prefix, id)
		g.releaseLocked(p.req.Blocks)
	}
	g.wakeLocked()
	g.mu.Unlock()
	return o, true
}

// releaseLocked gives up the blocks of a prefix the window no longer keeps (its agent
// finished, was paused or left): with the embedded engine they become the first to evict,
// except blocks an active agent's prefix shares. An LRU cache alone would keep a finished
// agent's context, used a moment ago, over the context of an active agent waiting for a tool,
// and evict the wrong one when the pool is full.
func (g *agentGate) releaseLocked(blocks []uint64) {
	if g.demote == nil || len(blocks) == 0 {
		return
	}
	kept := map[uint64]bool{}
	for _, bs := range g.prefix {
		for _, b := range bs {
			kept[b] = true
		}
	}
	out := make([]uint64, 0, len(blocks))
	for _, b := range blocks {
		if !kept[b] {
			out = append(out, b)
		}
	}
	if len(out) > 0 {
		g.demote(out)
	}
}

// observeAgent records a completed step's cache outcome (called from finished, before the
// step's StepDone) for the recompute-avoided count, and its final context length.
func (n *Node) observeAgent(p *prepared, u *engine.Usage) {
	g := n.agents
	if g == nil || p.adm.Agent == "" || n.cfg.Standalone {
		return // Standalone serves without the window (no agentStep to collect the context)
	}
	g.a.Observe(p.adm.Agent, u.CachedTokens, u.PromptTokens)
	g.mu.Lock()
	g.context[p] = u.PromptTokens + u.CompletionTokens
	g.mu.Unlock()
}

// agentRefused handles a dispatch attempt the agent window of peer (at addr) turned down: the
// step must wait, at the same home, so dispatch must not try other candidates. It reports
// whether it was such a refusal.
func (n *Node) agentRefused(p *prepared, peer, addr string, res *dispatchResult) bool {
	if n.agents == nil || p.adm.Agent == "" || res.lastCode != CodeAgentPaused {
		return false
	}
	res.requeue = true
	p.held = agentHold{home: peer, addr: addr}
	n.stick(p, peer) // the window and the prefix are there: the retry must go there too
	return true
}

// awaitAgent holds a step whose agent is outside its home's window until the agent is let in
// (this node is the home and wakes it, or a peer is and answers its hold), the step's queue
// TTL ends, the client leaves or the node drains. It then decides again, or answers the
// client and reports done. The step is held here, not in the waiting room, so it cannot
// block the requests queued behind it there, and it asks a peer home with holds, which keep
// the home's lease on the agent's place, rather than by sending the step again.
func (n *Node) awaitAgent(ctx context.Context, w http.ResponseWriter, p *prepared, pl *plan) (outcome, bool) {
	g := n.agents
	expires := n.adm.Item(p.adm, pl.d).Expires
	for {
		g.mu.Lock()
		h, here := g.held[p]
		g.mu.Unlock()
		in := true // the agent may be in the window, or gone from the registry: decide again
		if here {
			n.pauseAgent(ctx, h.wake, expires)
			ag, ok := g.a.Get(h.id)
			in = !ok || ag.State == agent.Active
		} else {
			st, err := n.holdAtHome(ctx, p, max(min(n.cfg.AgentInterval, time.Until(expires)), 0))
			if err != nil {
				// The home did not answer the hold (unreachable, or too old to know it): route
				// the step again after an interval, which asks with the step itself.
				n.log.Debug("agent hold", "agent", p.adm.Agent, "home", p.held.home, "err", err)
				n.pauseAgent(ctx, nil, expires)
			}
			in = err != nil || st == agent.Active || st == agent.Absent
		}
		now := time.Now()
		var giveUp *admit.Decision
		switch {
		case ctx.Err() != nil:
			return outcome{code: openai.CodeClientClosed, refused: true}, true
		case n.isDraining() || isClosed(g.stop):
			giveUp = &admit.Decision{Status: http.StatusServiceUnavailable, Code: "draining",
				Message: "the node is shutting down", RetryAfter: time.Second}
		case !now.Before(expires):
			d := n.adm.Expired(now)
			giveUp = &d
		}
		if giveUp != nil {
			n.m.decisionOf(*giveUp)
			writeRefusal(w, refusalOf(*giveUp), giveUp.RetryAfter)
			return outcome{code: giveUp.Code, refused: true}, true
		}
		if !in {
			continue
		}
		if here {
			// Routing may now send the step elsewhere, so this node stops tracking it as held;
			// its hold (p.held) stays until it runs or is given up.
			g.mu.Lock()
			delete(g.held, p)
			g.mu.Unlock()
		}
		// The window wait is admission's own doing, bounded by the queue TTL: the step's TTFT
		// SLO counts from here, so the checks ahead do not refuse it for time spent held.
		p.adm.SLOStart = now
		n.decide(now, p, pl)
		n.m.decisionOf(pl.d)
		return outcome{}, false
	}
}

// pauseAgent waits until wake closes (nil: never), an interval passes, expires comes, ctx
// ends or the agent control loop stops.
func (n *Node) pauseAgent(ctx context.Context, wake <-chan struct{}, expires time.Time) {
	t := time.NewTimer(max(min(n.cfg.AgentInterval, time.Until(expires)), 0))
	defer t.Stop()
	select {
	case <-wake:
	case <-t.C:
	case <-ctx.Done():
	case <-n.agents.stop:
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// holdAtHome sends the hold of p's step to its peer home and returns the agent's state there,
// after waiting up to wait (at the home) for the agent to be let into the window.
func (n *Node) holdAtHome(ctx context.Context, p *prepared, wait time.Duration) (agent.State, error) {
	ctx, cancel := context.WithTimeout(ctx, wait+n.cfg.AgentInterval)
	defer cancel()
	resp, err := n.tr.Forward(ctx, p.held.addr, n.leaseHeader(p, transport.KindAgentHold, wait), nil)
	if err != nil {
		return agent.Absent, err
	}
	_ = resp.Body.Close()
	return agentStateOf(resp.Headers[headerAgentState]), nil
}

// leaseHeader is the forward header of an agent-lease message about p's step.
func (n *Node) leaseHeader(p *prepared, kind transport.Kind, wait time.Duration) transport.Header {
	return transport.Header{Kind: kind, RequestID: p.req.ID, Hops: 1, Priority: p.adm.Priority, Tenant: p.adm.Tenant,
		AgentID: p.adm.Agent, Ingress: n.cfg.Name, HoldWait: wait}
}

// agentStateOf parses agent.State's String; anything else is Absent.
func agentStateOf(s string) agent.State {
	for _, st := range []agent.State{agent.Waiting, agent.Active, agent.Paused} {
		if s == st.String() {
			return st
		}
	}
	return agent.Absent
}

// renewAgentHold renews the home's lease on the agent of p's step while the step waits in this
// node's waiting room (let into the window, it waits for KV room there; or its home was not
// reachable): the home must keep the agent's place, or the slot it was let into, for it.
func (n *Node) renewAgentHold(ctx context.Context, p *prepared) {
	g := n.agents
	switch {
	case g == nil || p.held.home == "":
	case p.held.home == n.cfg.Name:
		g.mu.Lock()
		g.holdLocked(time.Now(), p.adm.Agent)
		g.mu.Unlock()
	default:
		if _, err := n.holdAtHome(ctx, p, 0); err != nil {
			n.log.Debug("agent hold", "agent", p.adm.Agent, "home", p.held.home, "err", err)
		}
	}
}

// giveUpAgent tells the home whose window holds p's step, if any, that the step ended without
// running, so its agent does not keep its place in the queue, or a slot it was let into for
// this step, until the lease runs out.
func (n *Node) giveUpAgent(p *prepared) {
	g, hold := n.agents, p.held
	p.held = agentHold{}
	switch {
	case g == nil || hold.home == "":
	case hold.home == n.cfg.Name:
		g.mu.Lock()
		delete(g.held, p)
		g.abandonLocked(time.Now(), p.adm.Agent, false)
		g.wakeLocked()
		g.mu.Unlock()
	default:
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.AgentInterval)
		defer cancel()
		resp, err := n.tr.Forward(ctx, hold.addr, n.leaseHeader(p, transport.KindAgentGiveUp, 0), nil)
		if err != nil {
			n.log.Debug("agent give-up", "agent", p.adm.Agent, "home", hold.home, "err", err)
			return // the home's lease runs out instead
		}
		_ = resp.Body.Close()
	}
}

// serveAgentLease answers a peer ingress's hold or give-up (transport.KindAgentHold,
// KindAgentGiveUp) of a step of agent h.AgentID.
func (n *Node) serveAgentLease(ctx context.Context, h transport.Header, fw transport.ResponseWriter) {
	g, st := n.agents, agent.Absent
	if g != nil && h.AgentID != "" {
		now := time.Now()
		if h.Kind == transport.KindAgentGiveUp {
			g.mu.Lock()
			g.abandonLocked(now, h.AgentID, false)
			g.wakeLocked()
			g.mu.Unlock()
		} else {
			st = g.hold(ctx, now, h.AgentID, min(h.HoldWait, n.cfg.AgentInterval))
		}
	}
	_ = fw.Accept(http.StatusOK, map[string]string{headerAgentState: st.String()})
}

// hold renews the lease of a held step of id and, while the agent is outside the window,
// waits up to wait for it to be let in (or for ctx or the control loop to end). It returns the
// agent's state then.
func (g *agentGate) hold(ctx context.Context, now time.Time, id string, wait time.Duration) agent.State {
	g.mu.Lock()
	st := g.holdLocked(now, id)
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
	if ag, ok := g.a.Get(id); ok {
		return ag.State
	}
	return agent.Absent
}

// holdLocked renews the lease of a step of id that an ingress (this node or a peer) still
// holds, and returns the agent's state. A step waiting for the window is a step boundary that
// has arrived, not silence: it refreshes the agent, so neither the lease nor the idle sweep
// drops it and its place in the queue. A step of an agent let into the window for it keeps
// that slot while it waits at its ingress for KV room. An agent active on its own account
// holds no lease.
func (g *agentGate) holdLocked(now time.Time, id string) agent.State {
	ag, ok := g.a.Get(id)
	switch {
	case !ok:
		return agent.Absent
	case ag.State != agent.Active:
		_, _ = g.a.Arrive(now, id, g.home, 0)
		g.asked[id] = now
	default:
		if _, leased := g.asked[id]; leased {
			g.asked[id] = now
		}
	}
	return ag.State
}

// abandonLocked abandons id, whose held step was given up by its ingress or (lease) went
// without a renewal for agentLeaseIntervals. The caller wakes the steps that this lets in.
func (g *agentGate) abandonLocked(now time.Time, id string, lease bool) {
	delete(g.asked, id)
	if !g.a.Abandon(now, id) {
		return
	}
	if lease {
		g.leaseExpired++
	} else {
		g.givenUp++
	}
}

// runAgents is the window's control loop: every AgentInterval it feeds U and H to the
// controller, abandons held steps that stopped asking, removes silent agents, forgets the
// prefixes of agents no longer active and wakes the steps of agents that re-entered the
// window.
func (n *Node) runAgents(ctx context.Context) {
	g := n.agents
	defer close(g.stop)
	t := time.NewTicker(n.cfg.AgentInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n.agentTick(time.Now())
	}
}

// agentTick is one control interval.
func (n *Node) agentTick(now time.Time) {
	g := n.agents
	st := n.eng.State()
	elsewhere := n.agentsAdvertised()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.releaseElsewhereLocked(now, elsewhere)
	g.a.TickSignals(now, g.home, g.signalsLocked(st))
	// A held step is a step boundary that has arrived, not silence: refresh its agent so the
	// idle sweep does not drop it (and its place in the queue) while it waits. A peer's
	// held step refreshes itself each time its ingress retries.
	heldHere := map[string]bool{}
	for _, h := range g.held {
		heldHere[h.id] = true
		g.holdLocked(now, h.id)
	}
	// A hold that was not renewed was given up by an ingress that could not say so (it
	// crashed, or its give-up was lost): the agent must not keep its place, or a slot it was
	// let into for that step.
	lease := agentLeaseIntervals * n.cfg.AgentInterval
	for id, at := range g.asked {
		if now.Sub(at) > lease && !heldHere[id] {
			g.abandonLocked(now, id, true)
		}
	}
	g.a.Sweep(now)
	active := map[string]bool{}
	for _, id := range g.a.Active(g.home) {
		active[id] = true
	}
	var released [][]uint64
	for id, bs := range g.prefix {
		if !active[id] {
			delete(g.prefix, id)
			released = append(released, bs)
		}
	}
	for _, bs := range released {
		g.releaseLocked(bs)
	}
	g.wakeLocked()
}

// agentsAdvertised returns, by route.AgentKey, the healthy peers that advertise being home to
// an agent (gossip State.AgentKeys), or nil when none does.
func (n *Node) agentsAdvertised() map[uint64][]string {
	if n.g == nil {
		return nil
	}
	var out map[uint64][]string
	for _, m := range n.g.Members() {
		if m.Self || m.Liveness != gossip.LivenessAlive || !m.Candidate && !m.Stale || !m.State.EngineHealthy {
			continue // the peers routing would send an agent's steps to
		}
		for _, k := range m.State.AgentKeys {
			if out == nil {
				out = map[uint64][]string{}
			}
			out[k] = append(out[k], m.Name)
		}
	}
	return out
}

// releaseElsewhereLocked lets go of the agents this node is home to that other peers
// advertise too, when one of those peers, not this node, is route.PreferredHome of them all.
// An agent gets two homes when its next step reaches another ingress before gossip says where
// it lives, and both register it; every ingress then sends its steps to the preferred home,
// so the other would hold a window slot (or a place in the queue) for an agent whose steps no
// longer come, until the idle timeout. The preferred home keeps it, and each other home
// releases it at its first tick with the agent between steps, so exactly one keeps it. A step
// held here for a released agent is woken and routed again, to the preferred home.
func (g *agentGate) releaseElsewhereLocked(now time.Time, elsewhere map[uint64][]string) {
	if len(elsewhere) == 0 {
		return
	}
	_, ids := g.a.Homed(g.home, nil, math.MaxInt)
	for _, id := range ids {
		peers := elsewhere[route.AgentKey(id)]
		if len(peers) == 0 || route.PreferredHome(id, append(peers[:len(peers):len(peers)], g.home)) == g.home {
			continue
		}
		if !g.a.Release(now, id) {
			continue // mid-step: asked again at the next tick
		}
		delete(g.asked, id)
		if bs, ok := g.prefix[id]; ok {
			delete(g.prefix, id)
			g.releaseLocked(bs)
		}
		if ch := g.wake[id]; ch != nil {
			close(ch)
			delete(g.wake, id)
		}
	}
}

// signalsLocked computes the window controller's two signals.
//
// H is the hit rate on the agents' own earlier context over the last interval: of the tokens
// the agents had already computed (their context at the end of their previous step), the
// share their next step found in the prefix cache, from the cached-token counts the engine
// reports per request; only agents that stayed in the window since their previous step
// count (a paused agent is expected to lose its prefix; counting it would make each cut look
// like more thrashing and cut again). That is exactly what thrashing destroys; the engine's own hit rate is
// not, because it is dominated by prefixes every agent shares (a system prompt stays hot
// while each agent's history is evicted) and averages over many seconds. With no agent step
// in the interval H keeps its last value.
//
// U is the share of the KV pool the window needs: the engine's KV use (blocks of running
// sequences, as vLLM and the simulator report it) plus the blocks of the active agents'
// prefixes that no running step holds. An engine counts an idle cached prefix as free,
// because it may evict it, so its own KV use stays low while the agents' prefixes are being
// evicted; U counts them, because the window means to keep them.
//
// Next is the share the window will need at its agents' next steps: U plus, for every active
// agent, the blocks its prompt grows by from one step to the next (the moving average
// GrowthTokens). Every active agent comes back with a longer context, so a window sized on U
// lets in agents whose next steps overflow the pool, and the only way back from that is a
// cut that pauses agents, whose prefixes are then lost and recomputed. The window grows only
// while Next is under target, so it stops letting agents in a step ahead of the overflow.
func (g *agentGate) signalsLocked(st engine.State) agent.Signals {
	s := g.a.Stats()
	avoided, recomputed := s.KeptAvoidedTokens-g.lastAvoided, s.KeptRecomputedTokens-g.lastRecomputed
	g.lastAvoided, g.lastRecomputed = s.KeptAvoidedTokens, s.KeptRecomputedTokens
	if avoided+recomputed > 0 {
		g.h = float64(avoided) / float64(avoided+recomputed)
	}
	if st.KVBlocksTotal <= 0 {
		return agent.Signals{U: math.NaN(), H: g.h} // no engine state yet: the controller skips the tick
	}
	running := map[uint64]bool{}
	var idle [][]uint64
	active := g.a.Active(g.home)
	for _, id := range active {
		ag, _ := g.a.Get(id)
		if ag.InStep {
			for _, b := range g.prefix[id] {
				running[b] = true
			}
		} else {
			idle = append(idle, g.prefix[id])
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
	if bt := max(st.BlockTokens, 1); s.GrowthTokens > 0 {
		growth = len(active) * int(math.Ceil(s.GrowthTokens/float64(bt)))
	}
	total := float64(st.KVBlocksTotal)
	now := float64(st.KVBlocksUsed + len(protected))
	return agent.Signals{U: now / total, Next: (now + float64(growth)) / total, H: g.h, PoolTokens: st.KVBlocksTotal * st.BlockTokens}
}

// wakeLocked releases the held steps of the agents the window let in since the last call.
func (g *agentGate) wakeLocked() {
	for _, id := range g.a.Resumable() {
		if ch := g.wake[id]; ch != nil {
			close(ch)
			delete(g.wake, id)
		}
	}
	// An agent that left the registry (swept, evicted, abandoned) will never be resumed: its
	// held step retries on its interval timer, so its channel can go.
	if len(g.wake) > 64 {
		for id := range g.wake {
			if _, ok := g.a.Get(id); !ok {
				delete(g.wake, id)
			}
		}
	}
}

// agentCollector exports the window's state at scrape time.
type agentCollector struct {
	g                                           *agentGate
	window, active, paused, waiting, agents     *prometheus.Desc
	pauses, resumes, admitted, swept, finished  *prometheus.Desc
	released, abandoned                         *prometheus.Desc
	kvUse, kvNext, hitRate, avoided, recomputed *prometheus.Desc
	windowCap, footprint                        *prometheus.Desc
}

func newAgentCollector(g *agentGate) *agentCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("kvmesh_agent_"+name, help, nil, nil)
	}
	return &agentCollector{
		g:        g,
		window:   d("window", "Agents this node's window lets be active at once."),
		active:   d("active", "Agents in the window."),
		paused:   d("paused", "Agents taken out of the window at a step boundary."),
		waiting:  d("waiting", "New agents whose first step waits for a window slot."),
		agents:   d("registered", "Agents this node remembers."),
		pauses:   d("pauses_total", "Agents paused because the window shrank."),
		resumes:  d("resumes_total", "Paused agents put back in the window."),
		admitted: d("admitted_total", "Agents that entered the window for the first time."),
		swept:    d("swept_total", "Agents removed after going silent past the idle timeout."),
		finished: d("finished_total", "Agents whose last step ("+HeaderAgentFinal+") ended."),
		released: d("released_total", "Agents let go because a peer registered them too and keeps them."),
		abandoned: prometheus.NewDesc("kvmesh_agent_abandoned_total",
			"Agents removed because the step held for them ended without running: given_up (its ingress said so) or lease (its ingress stopped renewing the hold).",
			[]string{"reason"}, nil),
		kvUse:      d("kv_use", "KV use (0..1) the window controller last saw: running sequences plus the active agents' idle prefixes."),
		kvNext:     d("kv_use_next", "KV use the window controller last predicted for the active agents' next steps: kv_use plus each one's growth (above 1: the pool overflows)."),
		windowCap:  d("window_cap", "The most agents the window may grow to: as many as the controller's HighU share of the KV pool holds at footprint_tokens each (its largest window while no agent has ended)."),
		footprint:  d("footprint_tokens", "An agent's mean context at the ends of its steps, averaged over agents that ended: what sets window_cap."),
		hitRate:    d("hit_rate", "Hit rate (0..1) on the agents' earlier context the window controller last saw."),
		avoided:    d("recompute_avoided_tokens_total", "Tokens of agents' earlier context served from cache instead of recomputed."),
		recomputed: d("recomputed_tokens_total", "Tokens of agents' earlier context that had to be recomputed."),
	}
}

func (c *agentCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.window, c.active, c.paused, c.waiting, c.agents, c.pauses, c.resumes,
		c.admitted, c.swept, c.finished, c.released, c.abandoned, c.kvUse, c.kvNext, c.hitRate, c.avoided, c.recomputed, c.windowCap, c.footprint} {
		ch <- d
	}
}

func (c *agentCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.g.a.Stats()
	u, next, h, wcap := 0.0, 0.0, 0.0, 0.0
	for _, hs := range s.Homes {
		if hs.Home == c.g.home {
			u, next, h, wcap = hs.Controller.U, hs.Controller.Next, hs.Controller.H, float64(hs.Controller.Cap)
		}
	}
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	counter := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	gauge(c.window, float64(c.g.a.Window(c.g.home)))
	gauge(c.active, float64(s.Active))
	gauge(c.paused, float64(s.Paused))
	gauge(c.waiting, float64(s.Waiting))
	gauge(c.agents, float64(s.Agents))
	gauge(c.kvUse, u)
	gauge(c.kvNext, next)
	gauge(c.hitRate, h)
	gauge(c.windowCap, wcap)
	gauge(c.footprint, s.FootprintTokens)
	counter(c.pauses, s.PausesTotal)
	counter(c.resumes, s.ResumesTotal)
	counter(c.admitted, s.AdmittedTotal)
	counter(c.swept, s.SweptTotal)
	counter(c.finished, s.FinishedTotal)
	counter(c.released, s.ReleasedTotal)
	c.g.mu.Lock()
	givenUp, lease := c.g.givenUp, c.g.leaseExpired
	c.g.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(c.abandoned, prometheus.CounterValue, float64(givenUp), "given_up")
	ch <- prometheus.MustNewConstMetric(c.abandoned, prometheus.CounterValue, float64(lease), "lease")
	counter(c.avoided, s.RecomputeAvoidedTokens)
	counter(c.recomputed, s.RecomputedTokens)
}
