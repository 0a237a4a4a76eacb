package journey

import (
	"context"
	"errors"
	"time"

	"github.com/kvmesh/kvmesh/admit"
)

// The waiting room's side of the journey: a request admission queues waits here (Wait) until
// the room loop (RunRoom) decides it again with the room it now has, or refuses it, or its
// client leaves.

// waiter is a request parked in the waiting room. The room loop settles its plan (an accept
// with candidates, or a refusal) and then closes ready; the handler goroutine waits on it.
type waiter struct {
	p     *Request
	t     *Ticket
	ready chan struct{}
	// backfilled: let out past its pool's blocked head (the last Next that offered it).
	backfilled bool
}

// KickRoom asks the room loop for a pass now (a request arrived or finished).
func (x *Executor) KickRoom() {
	select {
	case x.roomKick <- struct{}{}:
	default:
	}
}

// wait parks p until the room loop dispatches or refuses it (t.D is then final), or the
// client goes away (gone).
func (x *Executor) wait(ctx context.Context, p *Request, t *Ticket) (gone bool) {
	ctx, span := x.spans.Queue(ctx, t.D.Code)
	defer span.End()
	now := time.Now()
	wt := &waiter{p: p, t: t, ready: make(chan struct{})}
	it := x.adm.Item(p.Adm, t.D)
	it.Value = wt
	evicted, err := x.adm.Room().Push(now, it)
	for _, ev := range evicted {
		x.settle(ev, x.adm.Evicted(now))
	}
	if err != nil {
		t.D = admit.Decision{Action: admit.Refuse, Status: 429, Layer: admit.LayerQueue, Code: admit.CodeQueueFull,
			Message: "the waiting room is full", RetryAfter: x.adm.Room().RetryAfter(now), Role: it.Role}
		if !errors.Is(err, admit.ErrQueueFull) {
			t.D.Message = err.Error()
		}
		x.m.DecisionOf(t.D)
		return false
	}
	x.m.Queued.Inc()
	x.KickRoom()
	// A step an agent window parked (let in, it waits here for KV room at its home) renews the
	// home's lease on its agent each interval, or the home would give its slot away.
	var renew <-chan time.Time
	if p.Parked.Home != "" {
		t := time.NewTicker(x.cfg.AgentInterval)
		defer t.Stop()
		renew = t.C
	}
	for {
		select {
		case <-wt.ready:
			x.m.QueueTime.Observe(time.Since(now).Seconds())
			return false
		case <-renew:
			x.RenewLease(ctx, p)
		case <-ctx.Done():
			if _, ok := x.adm.Room().Remove(it.ID); ok {
				return true
			}
			<-wt.ready // settled at the same moment: take the decision's reservation back
			x.planner.Release(&t.Plan)
			return true
		}
	}
}

// settle ends a waiter's wait with decision d (already removed from the room).
func (x *Executor) settle(it *admit.Item, d admit.Decision) {
	wt := it.Value.(*waiter)
	d.Role = it.Role
	wt.t.D = d
	x.m.DecisionOf(d)
	close(wt.ready)
}

// RunRoom is the waiting room's dispatcher until ctx ends: on every kick or tick it expires
// waiters past their TTL and dispatches, best first, each waiter that now has a candidate
// with room. Once a second it calls everySecond first (the node's updates of what the room
// reads from the mesh); after each pass it hands publish the pools' heads it found blocked.
// When ctx ends it refuses every waiter left.
func (x *Executor) RunRoom(ctx context.Context, everySecond func(now time.Time), publish func(heads map[*admit.Item]bool)) {
	room := x.adm.Room()
	t := time.NewTicker(x.cfg.RoomTick)
	defer t.Stop()
	var lastRate time.Time
	heads := map[*admit.Item]bool{} // the pools' heads a pass found blocked (publish)
	for {
		select {
		case <-ctx.Done():
			x.drainRoom()
			return
		case <-t.C:
		case <-x.roomKick:
		}
		now := time.Now()
		if now.Sub(lastRate) >= time.Second {
			everySecond(now)
			lastRate = now
		}
		for _, it := range room.Expire(now) {
			x.settle(it, x.adm.Expired(now))
		}
		clear(heads)
		for room.Len() > 0 {
			it, ok := room.Next(now, func(it, head *admit.Item) bool {
				wt := it.Value.(*waiter)
				wt.backfilled = head != nil
				if head == nil {
					// Decided with the claim of its last pass as head (Admitter.Ready), then
					// claims afresh.
					x.Decide(now, wt.p, wt.t, it, nil)
					it.Claim = admit.Claim{}
					if wt.t.D.Action == admit.Queue {
						it.Claim = x.adm.ClaimFor(now, it, wt.t.Opts)
					}
					heads[it] = true
				} else {
					it.Claim = admit.Claim{} // no longer a head: it claims nothing
					x.Decide(now, wt.p, wt.t, it, &head.Claim)
				}
				return wt.t.D.Action != admit.Queue
			})
			if !ok {
				break
			}
			delete(heads, it)
			wt := it.Value.(*waiter)
			x.m.DecisionOf(wt.t.D)
			if wt.backfilled && wt.t.D.Action == admit.Accept {
				x.m.Backfilled.Inc()
			}
			close(wt.ready)
		}
		publish(heads)
	}
}

// drainRoom refuses every waiter when the node stops.
func (x *Executor) drainRoom() {
	room := x.adm.Room()
	for {
		it, ok := room.Next(time.Now(), func(_, _ *admit.Item) bool { return true })
		if !ok {
			return
		}
		x.settle(it, x.DrainingRefusal())
	}
}
