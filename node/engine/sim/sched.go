package sim

import (
	"time"

	"github.com/kvmesh/kvmesh/node/engine"
)

// scheduleLocked plans one step, vLLM v1 style: running sequences first, in arrival order,
// each taking what it still needs (1 token when decoding, a chunk when prefilling) from the
// token budget; then waiting sequences from the head while budget, seats and blocks last.
// When a running sequence's next blocks cannot be had, the most recently arrived running
// sequence is preempted (recompute) until they can. It returns the step's modelled duration
// and false if there is nothing to run. Evictions go to s.evicted.
func (s *Sim) scheduleLocked() (time.Duration, bool) {
	c := &s.cfg
	bt := c.BlockTokens
	budget := c.MaxNumBatchedTokens
	s.plan = s.plan[:0]
	s.evicted = s.evicted[:0]
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
			var ok bool
			if s.evicted, ok = s.cache.allocate(need, s.evicted); ok {
				q.own += need
				break
			}
			victim := s.running[len(s.running)-1]
			s.preemptLocked(victim)
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
		s.evicted, _ = s.cache.allocate(need, s.evicted)
		q.shared, q.own, q.computed = hits, need, hitTok
		s.waiting[0] = nil
		s.waiting = s.waiting[1:]
		q.state = running
		s.insertRunningLocked(q)
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
func (s *Sim) preemptLocked(q *seq) {
	s.freeLocked(q)
	s.removeRunningLocked(q)
	q.state = waiting
	q.estHit, _ = s.cache.lookup(q.blocks, (q.promptTokens+q.gen-1)/s.cfg.BlockTokens)
	q.estHit *= s.cfg.BlockTokens
	s.waiting = append(s.waiting, nil)
	copy(s.waiting[1:], s.waiting)
	s.waiting[0] = q
	s.nPreempt++
	s.log.Debug("sim: preempted", "seq", q.id, "generated", q.gen)
}

// recordLookupLocked adds one prefix-cache lookup to the counters and the hit-rate window.
func (s *Sim) recordLookupLocked(tokens, hits int) {
	s.nQueries += uint64(tokens)
	s.nHits += uint64(hits)
	s.hitWin = append(s.hitWin, hitSample{tokens, hits})
	s.hitTok += tokens
	s.hitOK += hits
	drop := 0
	for s.hitTok > s.cfg.HitRateWindow && len(s.hitWin)-drop > 1 {
		s.hitTok -= s.hitWin[drop].tokens
		s.hitOK -= s.hitWin[drop].hits
		drop++
	}
	if drop > 0 {
		s.hitWin = append(s.hitWin[:0], s.hitWin[drop:]...)
	}
}

// completeLocked finishes the planned step of duration d: KV computed, prompt blocks of
// finished prefills stored in the prefix cache (to s.stored), one token emitted by every
// sequence whose context is now fully computed. It returns the sequences that finished; the
// caller ends their streams after unlocking.
func (s *Sim) completeLocked(d time.Duration) []*seq {
	s.simNow += d
	s.stored = s.stored[:0]
	var ends []*seq
	now := time.Now()
	for _, it := range s.plan {
		q := it.q
		if q.state != running {
			continue // cancelled during the step
		}
		q.computed += it.n
		if q.computed < q.promptTokens+q.gen {
			continue // prefill chunk; more to come
		}
		if q.shared < len(q.blocks) {
			for _, h := range q.blocks[q.shared:] {
				if s.cache.store(h) {
					s.stored = append(s.stored, h)
				}
			}
			q.own -= len(q.blocks) - q.shared
			q.shared = len(q.blocks)
		}
		tok := word(q.tseed, q.gen)
		if q.logprobs {
			q.lp = append(q.lp, outputLogprob(q.tseed, q.gen, tok, q.topLogprobs))
		}
		text, stopped := q.out.add(tok, q.gen+1 >= q.minTokens)
		q.gen++
		s.nGen++
		st := q.stream
		if q.gen == 1 {
			st.mu.Lock()
			st.timing.TTFT = s.simNow - q.arrivalSim
			st.mu.Unlock()
			s.met.ttft.Observe(now.Sub(q.arrivalWall).Seconds())
		}
		finish := ""
		switch {
		case stopped:
			finish = engine.FinishStop
		case q.gen >= q.maxTokens:
			finish = engine.FinishLength
		case q.gen >= q.natural:
			finish = engine.FinishStop
		}
		if finish == "" {
			if text != "" {
				st.push(engine.Chunk{Text: text, Logprobs: q.lp})
				q.lp = nil
			}
			continue
		}
		if !stopped {
			text += q.out.flush()
		}
		st.mu.Lock()
		st.timing.E2E = s.simNow - q.arrivalSim
		st.mu.Unlock()
		s.met.e2e.Observe(now.Sub(q.arrivalWall).Seconds())
		st.push(engine.Chunk{Text: text, FinishReason: finish, Logprobs: q.lp, Usage: &engine.Usage{
			PromptTokens: q.promptTokens, CompletionTokens: q.gen, CachedTokens: q.cached,
		}})
		q.lp = nil
		s.dropLocked(q)
		ends = append(ends, q)
	}
	return ends
}
