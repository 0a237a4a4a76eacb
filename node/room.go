package node

import (
	"context"
	"errors"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/node/journey"
)

// waiter is a request parked in the waiting room. The room loop settles its plan (an accept
// with candidates, or a refusal) and then closes ready; the handler goroutine waits on it.
type waiter struct {
	p     *journey.Request
	t     *journey.Ticket
	ready chan struct{}
	// backfilled: let out past its pool's blocked head (the last Next that offered it).
	backfilled bool
}

// waitResult says how a wait ended: settled (t.D is final) or the client went away.
type waitResult struct{ gone bool }

// kickRoom asks the room loop for a pass now (a request arrived or finished).
func (n *Node) kickRoom() {
	select {
	case n.roomKick <- struct{}{}:
	default:
	}
}

// wait parks p until the room loop dispatches or refuses it, or the client goes away.
func (n *Node) wait(ctx context.Context, p *journey.Request, t *journey.Ticket) waitResult {
	ctx, span := n.startQueue(ctx, t.D)
	defer span.End()
	now := time.Now()
	wt := &waiter{p: p, t: t, ready: make(chan struct{})}
	it := n.adm.Item(p.Adm, t.D)
	it.Value = wt
	evicted, err := n.adm.Room().Push(now, it)
	for _, ev := range evicted {
		n.settle(ev, n.adm.Evicted(now))
	}
	if err != nil {
		t.D = admit.Decision{Action: admit.Refuse, Status: 429, Layer: admit.LayerQueue, Code: admit.CodeQueueFull,
			Message: "the waiting room is full", RetryAfter: n.adm.Room().RetryAfter(now), Role: it.Role}
		if !errors.Is(err, admit.ErrQueueFull) {
			t.D.Message = err.Error()
		}
		n.m.DecisionOf(t.D)
		return waitResult{}
	}
	n.m.Queued.Inc()
	n.kickRoom()
	// A step an agent window parked (let in, it waits here for KV room at its home) renews the
	// home's lease on its agent each interval, or the home would give its slot away.
	var renew <-chan time.Time
	if p.Parked.Home != "" {
		t := time.NewTicker(n.cfg.AgentInterval)
		defer t.Stop()
		renew = t.C
	}
	for {
		select {
		case <-wt.ready:
			n.m.QueueTime.Observe(time.Since(now).Seconds())
			return waitResult{}
		case <-renew:
			n.x.RenewLease(ctx, p)
		case <-ctx.Done():
			if _, ok := n.adm.Room().Remove(it.ID); ok {
				return waitResult{gone: true}
			}
			<-wt.ready // settled at the same moment: take the decision's reservation back
			n.planner.Release(&t.Plan)
			return waitResult{gone: true}
		}
	}
}

// settle ends a waiter's wait with decision d (already removed from the room).
func (n *Node) settle(it *admit.Item, d admit.Decision) {
	wt := it.Value.(*waiter)
	d.Role = it.Role
	wt.t.D = d
	n.m.DecisionOf(d)
	close(wt.ready)
}

// runRoom is the waiting room's dispatcher: on every kick or tick it expires waiters past
// their TTL and dispatches, best first, each waiter that now has a candidate with room.
func (n *Node) runRoom(ctx context.Context) {
	room := n.adm.Room()
	t := time.NewTicker(n.cfg.RoomTick)
	defer t.Stop()
	var lastRate time.Time
	heads := map[*admit.Item]bool{} // the pools' heads a pass found blocked (publishClaims)
	for {
		select {
		case <-ctx.Done():
			n.drainRoom()
			return
		case <-t.C:
		case <-n.roomKick:
		}
		now := time.Now()
		if now.Sub(lastRate) >= time.Second {
			n.updatePrefillRates()
			n.updateKeyUsage(now)
			n.updateMeshTokens()
			lastRate = now
		}
		for _, it := range room.Expire(now) {
			n.settle(it, n.adm.Expired(now))
		}
		clear(heads)
		for room.Len() > 0 {
			it, ok := room.Next(now, func(it, head *admit.Item) bool {
				wt := it.Value.(*waiter)
				wt.backfilled = head != nil
				if head == nil {
					// Decided with the claim of its last pass as head (Admitter.Ready), then
					// claims afresh.
					n.x.Decide(now, wt.p, wt.t, it, nil)
					it.Claim = admit.Claim{}
					if wt.t.D.Action == admit.Queue {
						it.Claim = n.adm.ClaimFor(now, it, wt.t.Opts)
					}
					heads[it] = true
				} else {
					it.Claim = admit.Claim{} // no longer a head: it claims nothing
					n.x.Decide(now, wt.p, wt.t, it, &head.Claim)
				}
				return wt.t.D.Action != admit.Queue
			})
			if !ok {
				break
			}
			delete(heads, it)
			wt := it.Value.(*waiter)
			n.m.DecisionOf(wt.t.D)
			if wt.backfilled && wt.t.D.Action == admit.Accept {
				n.m.Backfilled.Inc()
			}
			close(wt.ready)
		}
		n.publishClaims(heads)
	}
}

// drainRoom refuses every waiter when the node stops.
func (n *Node) drainRoom() {
	room := n.adm.Room()
	for {
		it, ok := room.Next(time.Now(), func(_, _ *admit.Item) bool { return true })
		if !ok {
			return
		}
		n.settle(it, n.x.DrainingRefusal())
	}
}

// updateKeyUsage tells the API keys what each consumed through the other nodes, from their
// latest state records, so that a key's rate holds across the mesh (admit/usage.go).
func (n *Node) updateKeyUsage(now time.Time) {
	if n.g == nil || n.adm.Keys().Len() == 0 {
		return
	}
	remote := map[uint64]float64{}
	for _, m := range n.g.Members() {
		if m.Self || m.Liveness != gossip.LivenessAlive {
			continue
		}
		for _, u := range m.State.KeyUsage {
			remote[u.ID] += u.TokensPerSecond
		}
	}
	n.adm.Keys().SetRemote(now, remote)
}

// updatePrefillRates tells the waiting room each model's prefill throughput across the mesh
// (poolRates), from which it derives its token caps (target TTFT × rate).
func (n *Node) updatePrefillRates() {
	var states []gossip.State
	if n.g == nil {
		states = append(states, n.localState())
	} else {
		for _, m := range n.g.Members() {
			if m.Candidate {
				states = append(states, m.State)
			}
		}
	}
	n.setPoolRates(states)
}

// setPoolRates sets the waiting room's pool rates from the nodes' states (poolRates).
func (n *Node) setPoolRates(states []gossip.State) {
	cfg := n.planner.Policy().Config()
	rates := poolRates(states, cfg.LocalPrefill(), cfg.Roles)
	for k, r := range rates {
		n.adm.Room().SetPrefillRate(k.model, k.role, r)
	}
	// A pool no node serves any more (its nodes left, or stopped running its requests) falls
	// back to queue.fallback_tokens rather than keep the rate it last had.
	for k := range n.ratedPools {
		if _, ok := rates[k]; !ok {
			n.adm.Room().SetPrefillRate(k.model, k.role, 0)
		}
	}
	n.ratedPools = rates
}

// poolKey names a waiting room pool: a model, and the role of its requests ("" whole,
// admit.RolePrefill split).
type poolKey struct{ model, role string }

// poolRates sums the prefill rates of the nodes in states by the pools whose requests they can
// take. The whole requests' pool counts the mixed nodes and the decode nodes that run requests
// whole (local: route.decode_local_prefill on this node, and the node does not advertise
// HalvesOnly); the split requests' pool the nodes that run a prefill half and those same
// decode nodes, to which a split request falls back when the prefill nodes are behind. Leaving
// those decode nodes out held a mesh of prefill and decode nodes to the fallback cap, far under
// what it prefills. roles is route.roles: when set, only nodes of those roles run whole
// requests.
func poolRates(states []gossip.State, local bool, roles []string) map[poolKey]float64 {
	rates := map[poolKey]float64{}
	for _, s := range states {
		whole := !route.IsHalf(s.Role) || (local && s.Role == route.RoleDecode && !s.HalvesOnly)
		whole = whole && route.RolesAllow(roles, s.Role)
		for _, m := range s.Models {
			if s.Role != route.RoleDecode || whole {
				rates[poolKey{m.Name, admit.RolePrefill}] += s.PrefillTokensPerSecond
			}
			if whole {
				rates[poolKey{m.Name, ""}] += s.PrefillTokensPerSecond
			}
		}
	}
	return rates
}
