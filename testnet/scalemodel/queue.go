package scalemodel

import "slices"

type entry struct {
	m         *message
	transmits int
	ready     float64
	dead      bool
}

// queue is a node's TransmitLimitedQueue of records: tiers by transmissions, newest last in
// each.
type queue struct {
	tiers    [][]*entry
	live     int
	limit    int
	byOrigin map[int32]*entry // the queued record of each origin
}

// push adds e at the top of its tier.
func (q *queue) push(e *entry) {
	for len(q.tiers) <= e.transmits {
		q.tiers = append(q.tiers, nil)
	}
	q.tiers[e.transmits] = append(q.tiers[e.transmits], e)
	q.live++
}

// pushRecord queues a record, replacing its origin's older one.
func (q *queue) pushRecord(m *message, ready float64) {
	if old := q.byOrigin[m.origin]; old != nil {
		if old.m.seq >= m.seq {
			return
		}
		old.dead = true
		q.live--
	}
	e := &entry{m: m, ready: ready}
	q.byOrigin[m.origin] = e
	q.push(e)
}

// take removes and returns the messages that fit limit bytes (overhead each), fewest
// transmissions first, newest first in a tier, ready by now; each goes back a tier higher
// until it reaches the queue's limit.
func (q *queue) take(now float64, limit, overhead int) []*message {
	var out []*message
	var again []*entry
	used := 0
	for tier := 0; tier < len(q.tiers) && limit-used > overhead; tier++ {
		es := q.tiers[tier]
		for j := len(es) - 1; j >= 0 && limit-used > overhead; j-- {
			e := es[j]
			if e.dead {
				es = slices.Delete(es, j, j+1)
				continue
			}
			if e.ready > now || int(e.m.size)+overhead > limit-used {
				continue
			}
			es = slices.Delete(es, j, j+1)
			used += int(e.m.size) + overhead
			out = append(out, e.m)
			e.transmits++
			if e.transmits >= q.limit {
				q.live--
				q.forget(e)
			} else {
				again = append(again, e)
			}
		}
		q.tiers[tier] = es
	}
	for _, e := range again {
		q.live--
		q.push(e)
	}
	return out
}

// prune keeps the max least transmitted messages (newest first), as memberlist's Prune, and
// returns how many it dropped.
func (q *queue) prune(max int) int {
	dropped := 0
	for tier := len(q.tiers) - 1; tier >= 0 && q.live > max; tier-- {
		es := q.tiers[tier]
		n := 0
		for n < len(es) && q.live > max {
			if e := es[n]; !e.dead {
				q.live--
				dropped++
				q.forget(e)
			}
			n++
		}
		q.tiers[tier] = slices.Delete(es, 0, n)
	}
	return dropped
}

func (q *queue) forget(e *entry) {
	if q.byOrigin != nil && q.byOrigin[e.m.origin] == e {
		delete(q.byOrigin, e.m.origin)
	}
}
