package sim

import (
	"cmp"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/node/engine"
)

// scheduleLocked plans one step, vLLM v1 style: running sequences first, in priority order
// then arrival order, each taking what it still needs (1 token when decoding, a chunk when
// prefilling) from the token budget; then waiting sequences from the head while budget, seats
// and blocks last. When a running sequence's next blocks cannot be had, the running sequence
// of lowest priority and latest arrival is preempted (recompute) until they can, and nothing
// new is admitted in that step. When the waiting head's blocks cannot be had, running
// sequences of strictly lower priority are preempted for it (see preemptForLocked). It
// returns the step's modelled duration and false if there is nothing to run. Evictions go to
// s.delta.
func (s *Sim) scheduleLocked() (time.Duration, bool) {
	c := &s.cfg
	bt := c.BlockTokens
	budget := c.MaxNumBatchedTokens
	s.plan = s.plan[:0]
	s.delta.Reset()
	preempted := false

	for i := 0; i < len(s.running) && budget > 0; i++ {
		q := s.running[i]
		if q.transferring {
			if s.simNow < q.xferEnd {
				continue // its KV is still crossing the link
			}
			q.transferring, q.kvIn = false, false
		}
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
			// The tail is after q in this loop's order, so never a sequence already planned.
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
	}

	// vLLM admits nothing new in a step that had to preempt for a running sequence: the pool
	// is already short. A waiting sequence whose adapter cannot join the batch is skipped.
	s.beginLoRAStepLocked()
	for i := 0; !preempted && budget > 0 && i < len(s.waiting) && len(s.running) < c.MaxNumSeqs; {
		q := s.waiting[i]
		if !s.loraFitsLocked(q) {
			i++
			continue
		}
		if q.kvIn {
			if !s.receiveLocked(q, i) {
				break // head of line waits for blocks
			}
			s.activateLoRALocked(q)
			continue
		}
		total := q.promptTokens + q.gen
		// At least one token must be computed to produce logits, so a full hit stops a block short.
		hits, evictableHits := s.cache.lookup(q.blocks, (total-1)/bt)
		hitTok := hits * bt
		n := min(total-hitTok, budget)
		need := (hitTok+n+bt-1)/bt - hits
		if need > s.cache.available()-evictableHits {
			if !s.preemptForLocked(q, hits, &budget) {
				break // head of line waits for blocks, as in vLLM
			}
			n = min(total-hitTok, budget)
			need = (hitTok+n+bt-1)/bt - hits
		}
		s.cache.acquire(q.blocks[:hits])
		s.cache.allocate(need, &s.delta)
		q.shared, q.own, q.computed = hits, need, hitTok
		s.takeWaitingLocked(i)
		q.state = running
		s.insertRunningLocked(q)
		s.activateLoRALocked(q)
		s.recordLookupLocked(total, hitTok)
		if !q.scheduled {
			q.cached = hitTok
			s.firstScheduledLocked(q)
		}
		s.plan = append(s.plan, planItem{q, n})
		budget -= n
	}
	if len(s.waiting) == 0 {
		s.waiting = s.waiting[:0:0] // let the popped prefix's backing array go
	}
	if len(s.plan) == 0 {
		// Nothing to compute: wait, if a handover is in transfer, for its KV to arrive.
		return s.transferWaitLocked()
	}
	var tokens, ctx int
	for _, it := range s.plan {
		tokens += it.n
		ctx += it.q.computed + it.n
	}
	return c.StepFixed + time.Duration(tokens)*c.StepPerToken + time.Duration(ctx)*c.StepPerContextToken + s.loraStepCostLocked(), true
}

// takeWaitingLocked removes the waiting sequence at index i.
func (s *Sim) takeWaitingLocked(i int) {
	if i == 0 {
		s.waiting[0] = nil
		s.waiting = s.waiting[1:]
		return
	}
	s.waiting = slices.Delete(s.waiting, i, i+1)
}

// firstScheduledLocked records q's first admission to the running batch: its time in the
// queue and its prompt's tokens.
func (s *Sim) firstScheduledLocked(q *seq) {
	q.scheduled = true
	s.nPrompt += uint64(q.promptTokens)
	q.stream.mu.Lock()
	q.stream.timing.Queue = s.simNow - q.arrivalSim
	q.stream.mu.Unlock()
	s.met.queue.Observe(time.Since(q.arrivalWall).Seconds())
}

// preemptForLocked makes room for the waiting head q, which holds hits cached blocks and cannot
// get the rest, by preempting running sequences of strictly lower priority, lowest priority
// and latest arrival first, until q's next chunk fits. A victim planned in this step leaves
// the plan and its tokens go back to *budget (q's chunk may grow with them). It preempts
// nothing, and reports false, when q would not fit even with every lower-priority sequence
// gone: a preemption that cannot admit q would only waste the victims' work. Equal and
// higher priorities are never preempted for a waiting sequence.
func (s *Sim) preemptForLocked(q *seq, hits int, budget *int) bool {
	bt := s.cfg.BlockTokens
	k := len(s.running)
	for k > 0 && s.running[k-1].priority < q.priority {
		k--
	}
	victims := s.running[k:]
	if len(victims) == 0 {
		return false
	}
	total, hitTok := q.promptTokens+q.gen, hits*bt
	fits := func(budget, avail, evictableHits int) bool {
		n := min(total-hitTok, budget)
		return (hitTok+n+bt-1)/bt-hits <= avail-evictableHits
	}
	// With every victim gone: their private blocks are free, and so is each cached block only
	// they hold (evictable, and usable by q without allocating if it is one of q's hits).
	refund, own, shared := 0, 0, 0
	for _, it := range s.plan {
		if it.q.priority < q.priority {
			refund += it.n
		}
	}
	for _, v := range victims {
		own += v.own
		shared += v.shared
	}
	_, evictableHits := s.cache.lookup(q.blocks, hits)
	avail := s.cache.available() + own
	if !fits(*budget+refund, avail+shared, evictableHits) {
		return false // even if all their cached blocks came free
	}
	refs := make(map[uint64]int, shared)
	for _, v := range victims {
		for _, h := range v.blocks[:v.shared] {
			refs[h]++
		}
	}
	for h, n := range refs {
		if s.cache.entries[h].refs == n {
			avail++
		}
	}
	for _, h := range q.blocks[:hits] {
		if n := refs[h]; n > 0 && s.cache.entries[h].refs == n {
			evictableHits++
		}
	}
	if !fits(*budget+refund, avail, evictableHits) {
		return false
	}
	for !fits(*budget, s.cache.available(), evictableHits) {
		v := s.running[len(s.running)-1]
		if v.priority >= q.priority {
			return false // unreachable: with every victim gone q fits
		}
		*budget += s.unplanLocked(v)
		s.preemptLocked(v)
		_, evictableHits = s.cache.lookup(q.blocks, hits)
	}
	return true
}

// unplanLocked removes q from this step's plan and returns the tokens it had (0 if none).
func (s *Sim) unplanLocked(q *seq) int {
	for i, it := range s.plan {
		if it.q == q {
			s.plan = slices.Delete(s.plan, i, i+1)
			return it.n
		}
	}
	return 0
}

// preemptLocked frees q's blocks and puts it back at the front of its priority band in the
// waiting queue; its output so far is kept and its KV will be recomputed.
func (s *Sim) preemptLocked(q *seq) {
	s.freeLocked(q)
	s.removeRunningLocked(q)
	q.state = waiting
	q.estHit, _ = s.cache.lookup(q.blocks, (q.promptTokens+q.gen-1)/s.cfg.BlockTokens)
	q.estHit *= s.cfg.BlockTokens
	if q.transferring { // its KV had not arrived: it is admitted as a handover again
		q.transferring = false
		q.estHit = q.promptTokens - 1
	}
	s.waiting = slices.Insert(s.waiting, s.bandFrontLocked(q.priority), q)
	s.nPreempt++
	s.log.Debug("sim: preempted", "seq", q.id, "priority", q.priority, "generated", q.gen)
}

// The queues' order. The waiting queue is sorted by priority, higher first, and within a
// priority by arrival, except that a preempted sequence goes to the front of its priority
// (it arrived before any sequence of its priority still waiting there, bar other preempted
// ones). The running list is sorted by priority, higher first, then arrival (id): the order
// in which running sequences take the step's budget, so its tail is the preemption victim.
// With every priority equal both are first come, first served: so under SchedulingFCFS, which
// gives every sequence priority 0 (schedPriority).

// enqueueLocked puts a new sequence at the back of its priority band in the waiting queue.
func (s *Sim) enqueueLocked(q *seq) {
	i := len(s.waiting)
	for i > 0 && s.waiting[i-1].priority < q.priority {
		i--
	}
	s.waiting = slices.Insert(s.waiting, i, q)
}

// bandFrontLocked returns the waiting queue index of the front of priority p's band: after
// every sequence of higher priority.
func (s *Sim) bandFrontLocked(p int) int {
	i := 0
	for i < len(s.waiting) && s.waiting[i].priority > p {
		i++
	}
	return i
}

// runOrder orders the running list: higher priority first, then earlier arrival.
func runOrder(a, b *seq) int {
	if c := cmp.Compare(b.priority, a.priority); c != 0 {
		return c
	}
	return cmp.Compare(a.id, b.id)
}

// priorityClass maps a priority to its index in State's split of queued prefill: 0 high
// (> 0), 1 normal (0), 2 low (< 0).
func priorityClass(p int) int {
	switch {
	case p > 0:
		return 0
	case p < 0:
		return 2
	}
	return 1
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

// tokenLocked generates q's token i (its place in the whole generation): the text now safe to
// send and whether a stop sequence matched, or for a tool call the call's piece.
func (s *Sim) tokenLocked(q *seq, i int) (string, bool, []engine.ToolCall) {
	if q.call != nil {
		return "", false, []engine.ToolCall{q.call.piece(i)}
	}
	tok := word(q.tseed, i)
	if q.logprobs {
		q.lp = append(q.lp, outputLogprob(q.tseed, i, tok, q.topLogprobs))
	}
	text, stopped := q.out.add(tok, i+1 >= q.minTokens)
	return text, stopped, nil
}

// completeLocked finishes the planned step of duration d: KV computed, prompt blocks of
// finished prefills stored in the prefix cache (to s.delta), one token emitted by every
// sequence whose context is now fully computed. It returns the sequences that finished; the
// caller ends their streams after unlocking.
func (s *Sim) completeLocked(d time.Duration) []*seq {
	s.simNow += d
	s.delta.Reset()
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
			for i := q.shared; i < len(q.blocks); i++ {
				if s.cache.store(q.blocks[i], i) {
					s.delta.Store(q.blocks[i], i)
				}
			}
			q.own -= len(q.blocks) - q.shared
			q.shared = len(q.blocks)
		}
		if q.prefillOnly {
			s.handOverLocked(q, now)
			ends = append(ends, q)
			continue
		}
		i := q.base + q.gen // the token's place in the whole generation
		text, stopped, calls := s.tokenLocked(q, i)
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
		case q.call != nil && i+1 >= len(q.call.pieces):
			finish = engine.FinishToolCalls
		case i+1 >= q.maxTokens:
			finish = engine.FinishLength
		case i+1 >= q.natural:
			finish = engine.FinishStop
		}
		if finish == "" {
			if text != "" || calls != nil {
				st.push(engine.Chunk{Text: text, Logprobs: q.lp, ToolCalls: calls})
				q.lp = nil
			}
			continue
		}
		if !stopped {
			rest, hit := q.out.finish()
			text += rest
			if hit {
				finish = engine.FinishStop
			}
		}
		st.mu.Lock()
		st.timing.E2E = s.simNow - q.arrivalSim
		st.mu.Unlock()
		s.met.e2e.Observe(now.Sub(q.arrivalWall).Seconds())
		st.push(engine.Chunk{Text: text, FinishReason: finish, Logprobs: q.lp, ToolCalls: calls, Usage: &engine.Usage{
			PromptTokens: q.usagePrompt, CompletionTokens: q.base + q.gen, CachedTokens: min(q.cached, q.usagePrompt),
		}})
		q.lp = nil
		s.dropLocked(q)
		ends = append(ends, q)
	}
	return ends
}
