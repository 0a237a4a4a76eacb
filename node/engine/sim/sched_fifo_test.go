package sim

import (
	"cmp"
	"slices"
	"time"
)

// The scheduler as it was before priorities, verbatim but for the fifo names: the reference
// TestEqualPrioritiesScheduleAsFIFO compares the priority scheduler with.

func (s *Sim) fifoScheduleLocked() (time.Duration, bool) {
	c := &s.cfg
	bt := c.BlockTokens
	budget := c.MaxNumBatchedTokens
	s.plan = s.plan[:0]
	s.delta.Reset()
	var tokens, ctx int
	preempted := false

	for i := 0; i < len(s.running) && budget > 0; i++ {
		q := s.running[i]
		n := min(q.promptTokens+q.gen-q.computed, budget)
		if n <= 0 {
			continue
		}
		need := (q.computed+n+bt-1)/bt - q.shared - q.own
		self := false
		for need > 0 {
			if s.cache.allocate(need, &s.delta) {
				q.own += need
				break
			}
			victim := s.running[len(s.running)-1]
			s.fifoPreemptLocked(victim)
			preempted = true
			if victim == q {
				self = true
				break
			}
		}
		if self {
			break
		}
		s.plan = append(s.plan, planItem{q, n})
		budget -= n
		tokens += n
		ctx += q.computed + n
	}

	// vLLM admits nothing new in a step that had to preempt: the pool is already short.
	for !preempted && budget > 0 && len(s.waiting) > 0 && len(s.running) < c.MaxNumSeqs {
		q := s.waiting[0]
		total := q.promptTokens + q.gen
		// At least one token must be computed to produce logits, so a full hit stops a block short.
		hits, evictableHits := s.cache.lookup(q.blocks, (total-1)/bt)
		hitTok := hits * bt
		n := min(total-hitTok, budget)
		need := (hitTok+n+bt-1)/bt - hits
		if need > s.cache.available()-evictableHits {
			break // head of line waits for blocks, as in vLLM
		}
		s.cache.acquire(q.blocks[:hits])
		s.cache.allocate(need, &s.delta)
		q.shared, q.own, q.computed = hits, need, hitTok
		s.waiting[0] = nil
		s.waiting = s.waiting[1:]
		q.state = running
		s.fifoInsertRunningLocked(q)
		s.recordLookupLocked(total, hitTok)
		if !q.scheduled {
			q.scheduled = true
			q.cached = hitTok
			s.nPrompt += uint64(q.promptTokens)
			q.stream.mu.Lock()
			q.stream.timing.Queue = s.simNow - q.arrivalSim
			q.stream.mu.Unlock()
			s.met.queue.Observe(time.Since(q.arrivalWall).Seconds())
		}
		s.plan = append(s.plan, planItem{q, n})
		budget -= n
		tokens += n
		ctx += q.computed + n
	}
	if len(s.waiting) == 0 {
		s.waiting = s.waiting[:0:0] // let the popped prefix's backing array go
	}
	if len(s.plan) == 0 {
		return 0, false
	}
	return c.StepFixed + time.Duration(tokens)*c.StepPerToken + time.Duration(ctx)*c.StepPerContextToken, true
}

// preemptLocked frees q's blocks and puts it back at the head of the waiting queue; its
// output so far is kept and its KV will be recomputed.
func (s *Sim) fifoPreemptLocked(q *seq) {
	s.freeLocked(q)
	s.fifoRemoveRunningLocked(q)
	q.state = waiting
	q.estHit, _ = s.cache.lookup(q.blocks, (q.promptTokens+q.gen-1)/s.cfg.BlockTokens)
	q.estHit *= s.cfg.BlockTokens
	s.waiting = append(s.waiting, nil)
	copy(s.waiting[1:], s.waiting)
	s.waiting[0] = q
	s.nPreempt++
	s.log.Debug("sim: preempted", "seq", q.id, "generated", q.gen)
}

func (s *Sim) fifoRemoveRunningLocked(q *seq) {
	i, ok := slices.BinarySearchFunc(s.running, q.id, func(e *seq, id uint64) int { return cmp.Compare(e.id, id) })
	if ok {
		s.running = slices.Delete(s.running, i, i+1)
	}
}

func (s *Sim) fifoInsertRunningLocked(q *seq) {
	i, _ := slices.BinarySearchFunc(s.running, q.id, func(e *seq, id uint64) int { return cmp.Compare(e.id, id) })
	s.running = slices.Insert(s.running, i, q)
}
