package sim

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/node/engine"
)

// planned is one entry of a step's plan: which sequence (by arrival number) computes how many
// tokens.
type planned struct {
	id uint64
	n  int
}

// submitPrio queues a request of tokens prompt tokens (text unique to tag) and priority prio
// that runs to maxTokens, without starting the step loop.
func submitPrio(t *testing.T, s *Sim, tag string, tokens, maxTokens, prio int) *Stream {
	t.Helper()
	p := prompt(tag, tokens)
	st, err := s.submit(context.Background(), &engine.Request{
		Model: testModel, Prompt: p, MaxTokens: maxTokens, Seed: fullSeed(t, p, maxTokens), Priority: prio,
	})
	if err != nil {
		t.Fatalf("submit %s: %v", tag, err)
	}
	return st
}

// schedule plans one step with sched (the Sim's scheduler or the reference) and returns the
// plan and the step's duration; ok is false if there was nothing to run.
func schedule(s *Sim, sched func() (time.Duration, bool)) (plan []planned, d time.Duration, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok = sched()
	for _, it := range s.plan {
		plan = append(plan, planned{it.q.id, it.n})
	}
	return plan, d, ok
}

// complete finishes the planned step of duration d and ends the streams that finished.
func complete(s *Sim, d time.Duration) {
	s.mu.Lock()
	ends := s.completeLocked(d)
	s.mu.Unlock()
	for _, q := range ends {
		q.stream.end(io.EOF)
	}
}

// step schedules and completes one step with the Sim's scheduler and returns its plan.
func step(t *testing.T, s *Sim) []planned {
	t.Helper()
	plan, d, ok := schedule(s, s.scheduleLocked)
	if ok {
		complete(s, d)
	}
	return plan
}

func ids(qs []*seq) []uint64 {
	out := make([]uint64, len(qs))
	for i, q := range qs {
		out[i] = q.id
	}
	return out
}

func queues(s *Sim) (running, waiting []uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return ids(s.running), ids(s.waiting)
}

func preemptions(s *Sim) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nPreempt
}

// TestEqualPrioritiesScheduleAsFIFO pins that priorities change nothing when they are all
// equal: one workload (chunked prefills, shared prefixes, evictions, preemptions, a full
// batch, cancellations) runs on two Sims, one stepped by the scheduler and one by the
// scheduler as it was before priorities (sched_fifo_test.go), and every step's plan,
// duration, evictions, stores and queues must match.
func TestEqualPrioritiesScheduleAsFIFO(t *testing.T) {
	for _, prio := range []int{0, 3, -2} {
		t.Run(fmt.Sprint("priority ", prio), func(t *testing.T) {
			mod := func(c *Config) { c.KVBlocks = 48; c.MaxNumBatchedTokens = 96; c.MaxNumSeqs = 6 }
			got, ref := newTestSim(t, mod), newTestSim(t, mod)
			rng := rand.New(rand.NewPCG(1, uint64(prio+10)))
			var gotStreams, refStreams []*Stream
			submitBoth := func(i int) {
				var p []byte
				if rng.IntN(3) > 0 { // two in three share one of three 64-token prefixes
					p = append(prompt(fmt.Sprint("prefix-", rng.IntN(3)), 64), prompt(fmt.Sprint("own-", i), 1+rng.IntN(120))...)
				} else {
					p = prompt(fmt.Sprint("own-", i), 1+rng.IntN(180))
				}
				req := engine.Request{Model: testModel, Prompt: p, MaxTokens: 1 + rng.IntN(64), Seed: rng.Uint64(), Priority: prio}
				for _, x := range []struct {
					s  *Sim
					ss *[]*Stream
				}{{got, &gotStreams}, {ref, &refStreams}} {
					r := req
					st, err := x.s.submit(context.Background(), &r)
					if err != nil {
						t.Fatal(err)
					}
					*x.ss = append(*x.ss, st)
				}
			}
			var evictions, chunks int
			for i, n := 0, 0; i < 20000; i++ {
				if i < 300 {
					for range rng.IntN(3) {
						submitBoth(n)
						n++
					}
					if i%37 == 36 {
						k := rng.IntN(len(gotStreams))
						gotStreams[k].Close()
						refStreams[k].Close()
					}
				}
				gotPlan, gotD, gotOK := schedule(got, got.scheduleLocked)
				refPlan, refD, refOK := schedule(ref, ref.fifoScheduleLocked)
				if !slices.Equal(gotPlan, refPlan) || gotD != refD || gotOK != refOK {
					t.Fatalf("step %d: plan %v (%v), reference %v (%v)", i, gotPlan, gotD, refPlan, refD)
				}
				if !slices.Equal(got.delta.Evicted, ref.delta.Evicted) {
					t.Fatalf("step %d: evicted %x, reference %x", i, got.delta.Evicted, ref.delta.Evicted)
				}
				evictions += len(ref.delta.Evicted)
				for _, it := range ref.plan {
					if it.q.computed+it.n < it.q.promptTokens+it.q.gen {
						chunks++ // a prefill cut short by the budget
					}
				}
				if !gotOK {
					if i >= 300 {
						break
					}
					continue
				}
				complete(got, gotD)
				complete(ref, refD)
				if !slices.Equal(got.delta.Stored, ref.delta.Stored) {
					t.Fatalf("step %d: stored %x, reference %x", i, got.delta.Stored, ref.delta.Stored)
				}
				gr, gw := queues(got)
				rr, rw := queues(ref)
				if !slices.Equal(gr, rr) || !slices.Equal(gw, rw) {
					t.Fatalf("step %d: running %v waiting %v, reference %v %v", i, gr, gw, rr, rw)
				}
			}
			if st := got.State(); st.Running != 0 || st.Waiting != 0 {
				t.Fatalf("workload did not drain: %+v", st)
			}
			// The workload must reach every path the comparison is meant to cover.
			if p := preemptions(ref); p == 0 || evictions == 0 || chunks == 0 || ref.nHits == 0 {
				t.Errorf("workload too easy: %d preemptions, %d evictions, %d prefill chunks, %d hit tokens", p, evictions, chunks, ref.nHits)
			}
			if preemptions(got) != preemptions(ref) {
				t.Errorf("preemptions %d, reference %d", preemptions(got), preemptions(ref))
			}
		})
	}
}

// TestPreemptionVictim pins who a running sequence short of blocks preempts: the running
// sequence of lowest priority, latest arrival among those; and that the victim goes back to
// the front of its priority band in the waiting queue, behind higher priorities. Three
// sequences of one block each decode in a pool of four: the first to need a block takes the
// free one, the second preempts one victim.
func TestPreemptionVictim(t *testing.T) {
	tests := []struct {
		name   string
		prios  [3]int // of sequences 1, 2, 3 in arrival order
		victim uint64
	}{
		{"equal: latest arrival", [3]int{0, 0, 0}, 3},
		{"lowest priority", [3]int{0, -1, 0}, 2},
		{"lowest priority, latest of those", [3]int{-1, -1, 0}, 2},
		{"lowest priority is the latest", [3]int{-1, 0, -1}, 3},
		{"all high: lowest of them", [3]int{2, 1, 5}, 2},
		{"earliest arrival when lowest", [3]int{-1, 5, 5}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestSim(t, func(c *Config) { c.KVBlocks = 4; c.MaxNumSeqs = 3 })
			for i, p := range tt.prios {
				submitPrio(t, s, fmt.Sprint("victim-", i), 16, 10, p)
			}
			if plan := step(t, s); len(plan) != 3 {
				t.Fatalf("first step %v, want all three prefilled", plan)
			}
			// Two waiting (no seat) on either side of every band above.
			submitPrio(t, s, "above", 16, 10, 9)
			submitPrio(t, s, "below", 16, 10, -9)
			plan := step(t, s)
			running, waiting := queues(s)
			if want := []uint64{4, tt.victim, 5}; !slices.Equal(waiting, want) {
				t.Errorf("waiting %v, want %v: the victim %d at the front of its band", waiting, want, tt.victim)
			}
			if slices.Contains(running, tt.victim) || len(running) != 2 || len(plan) != 2 || preemptions(s) != 1 {
				t.Errorf("running %v plan %v preemptions %d, want one victim (%d) and two decoding", running, plan, preemptions(s), tt.victim)
			}
		})
	}
}

// TestWaitingPreemptsLowerPriority pins what the waiting head does when its blocks cannot be
// had: it preempts running sequences of strictly lower priority, lowest and latest first,
// only as many as it needs, and is admitted in the same step (with the victims' budget); it
// preempts none of equal or higher priority, and none at all when preempting every lower one
// would not make room. Three sequences of 30 tokens (2 blocks each, one cached and one
// partial) run in a pool of 8 blocks, so 2 are free when the head arrives.
func TestWaitingPreemptsLowerPriority(t *testing.T) {
	tests := []struct {
		name    string
		prios   [3]int    // running sequences 1, 2, 3
		tags    [3]string // their prompts' text (a shared tag shares the first block)
		prio    int       // the waiting request (4)
		tag     string
		tokens  int
		budget  int // step budget once the three are running (0: the default)
		plan    []planned
		waiting []uint64
		preempt uint64
	}{
		{
			name:  "lowest, latest first; the victim's budget goes to the head",
			prios: [3]int{-1, -1, 0}, prio: 1, tokens: 40, budget: 41,
			// Three decodes leave 38 tokens: 3 blocks. Preempting 2 frees 2 blocks and its token.
			plan:    []planned{{3, 1}, {1, 1}, {4, 39}},
			waiting: []uint64{2}, preempt: 1,
		},
		{
			name:  "as many as it takes, strictly lower only",
			prios: [3]int{-1, 0, -1}, prio: 0, tokens: 70, // 5 blocks: 2 free + 3's 2 + 1's 2
			plan:    []planned{{2, 1}, {4, 70}},
			waiting: []uint64{1, 3}, preempt: 2,
		},
		{
			name:  "equal priority is not preempted",
			prios: [3]int{0, 0, 0}, prio: 0, tokens: 40,
			plan:    []planned{{1, 1}, {2, 1}, {3, 1}},
			waiting: []uint64{4},
		},
		{
			name:  "higher priority is not preempted",
			prios: [3]int{1, 1, 1}, prio: 0, tokens: 40,
			plan:    []planned{{1, 1}, {2, 1}, {3, 1}},
			waiting: []uint64{4},
		},
		{
			name:  "no preemption that cannot make room",
			prios: [3]int{1, -1, 1}, prio: 1, tokens: 70, // 5 blocks; 2's 2 and the free 2 are 4
			plan:    []planned{{1, 1}, {3, 1}, {2, 1}},
			waiting: []uint64{4},
		},
		{
			name:  "a victim's cached block the head reuses",
			prios: [3]int{1, -1, 1}, tags: [3]string{"", "shared", ""},
			prio: 1, tag: "shared", tokens: 60, // 4 blocks, the first cached and held by 2 alone
			plan:    []planned{{1, 1}, {3, 1}, {4, 44}},
			waiting: []uint64{2}, preempt: 1,
		},
		{
			name:  "a cached block another sequence still holds is not freed by the victim",
			prios: [3]int{1, -1, 1}, tags: [3]string{"shared", "shared", ""},
			// 1 and 2 share their first block, so 3 are free; 6 blocks, 1 cached: 5 to allocate.
			// Preempting 2 frees only its partial block: 4.
			prio: 1, tag: "shared", tokens: 81,
			plan:    []planned{{1, 1}, {3, 1}, {2, 1}},
			waiting: []uint64{4},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestSim(t, func(c *Config) { c.KVBlocks = 8 })
			for i, p := range tt.prios {
				tag := tt.tags[i]
				if tag == "" {
					tag = fmt.Sprint("run-", i)
				}
				submitPrio(t, s, tag, 30, 10, p)
			}
			if plan := step(t, s); len(plan) != 3 {
				t.Fatalf("first step %v, want all three prefilled", plan)
			}
			if tt.budget > 0 {
				s.mu.Lock()
				s.cfg.MaxNumBatchedTokens = tt.budget
				s.mu.Unlock()
			}
			tag := tt.tag
			if tag == "" {
				tag = "head"
			}
			submitPrio(t, s, tag, tt.tokens, 5, tt.prio)
			plan, d, _ := schedule(s, s.scheduleLocked)
			_, waiting := queues(s)
			if !slices.Equal(plan, tt.plan) || !slices.Equal(waiting, tt.waiting) {
				t.Errorf("plan %v waiting %v, want %v and %v", plan, waiting, tt.plan, tt.waiting)
			}
			if p := preemptions(s); p != tt.preempt {
				t.Errorf("%d preemptions, want %d", p, tt.preempt)
			}
			// The step is charged for the final plan only, not for the victims' planned work.
			var tokens, ctx int
			s.mu.Lock()
			for _, it := range s.plan {
				tokens += it.n
				ctx += it.q.computed + it.n
			}
			free := s.cache.free()
			s.mu.Unlock()
			if want := stepTime(s.cfg, tokens, ctx); d != want {
				t.Errorf("step time %v, want %v", d, want)
			}
			if free < 0 {
				t.Errorf("%d blocks free: more allocated than the pool", free)
			}
			complete(s, d)
		})
	}
}

// TestWaitingOrder pins the waiting queue's order: priority, then arrival, so a flood of new
// requests of one priority never overtakes an earlier one of that priority.
func TestWaitingOrder(t *testing.T) {
	s := newTestSim(t, func(c *Config) { c.MaxNumSeqs = 1 })
	for i, p := range []int{0, 1, -1, 0, 1, -1, 0} {
		submitPrio(t, s, fmt.Sprint("order-", i), 4, 1, p)
	}
	if _, waiting := queues(s); !slices.Equal(waiting, []uint64{2, 5, 1, 4, 7, 3, 6}) {
		t.Fatalf("waiting %v, want the 1s, the 0s, the -1s, each in arrival order", waiting)
	}
	// One seat, one step a request; another 0 arrives before every step.
	var admitted []uint64
	for i := range 10 {
		submitPrio(t, s, fmt.Sprint("flood-", i), 4, 1, 0)
		plan := step(t, s)
		if len(plan) != 1 {
			t.Fatalf("step %d: plan %v, want one request", i, plan)
		}
		admitted = append(admitted, plan[0].id)
	}
	if want := []uint64{2, 5, 1, 4, 7, 8, 9, 10, 11, 12}; !slices.Equal(admitted, want) {
		t.Errorf("admitted %v, want %v", admitted, want)
	}
}

// TestRunningBudgetByPriority pins the order in which running sequences take the step's
// budget: priority, then arrival. Two sequences decode; a third (arrived last) is mid-prefill
// when the budget of 10 tokens is shared out.
func TestRunningBudgetByPriority(t *testing.T) {
	tests := []struct {
		name  string
		prios [3]int // decoders 1 and 2, then the prefill 3
		plan  []planned
	}{
		{"equal: arrival order", [3]int{0, 0, 0}, []planned{{1, 1}, {2, 1}, {3, 8}}},
		{"higher prefill first", [3]int{-1, -1, 0}, []planned{{3, 10}}},
		{"by priority across the batch", [3]int{1, -1, 0}, []planned{{1, 1}, {3, 9}}},
		{"lower prefill last", [3]int{0, 0, -1}, []planned{{1, 1}, {2, 1}, {3, 8}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestSim(t, func(c *Config) { c.MaxNumBatchedTokens = 10 })
			submitPrio(t, s, "decode-1", 4, 10, tt.prios[0])
			submitPrio(t, s, "decode-2", 4, 10, tt.prios[1])
			step(t, s)
			submitPrio(t, s, "prefill", 100, 10, tt.prios[2])
			if plan := step(t, s); !slices.Contains(plan, planned{3, 8}) {
				t.Fatalf("second step %v, want 3 admitted with the 8 tokens left", plan)
			}
			if plan := step(t, s); !slices.Equal(plan, tt.plan) {
				t.Errorf("plan %v, want %v", plan, tt.plan)
			}
		})
	}
}

// TestStateQueuedByClass pins State's split of the queued prefill by priority class, for
// waiting requests and for running ones mid-prefill.
func TestStateQueuedByClass(t *testing.T) {
	s := newTestSim(t, func(c *Config) { c.MaxNumBatchedTokens = 64 })
	submitPrio(t, s, "a", 100, 5, 1)
	submitPrio(t, s, "b", 50, 5, 0)
	submitPrio(t, s, "c", 30, 5, -2)
	submitPrio(t, s, "d", 20, 5, 0)
	check := func(when string, total, beforeHigh, lowWaiting int) {
		t.Helper()
		st := s.State()
		if !st.PriorityScheduling || st.QueuedPrefillTokens != total || st.QueuedBeforeHigh != beforeHigh || st.QueuedLowWaiting != lowWaiting {
			t.Errorf("%s: total %d, before high %d, low waiting %d; want %d %d %d", when, st.QueuedPrefillTokens,
				st.QueuedBeforeHigh, st.QueuedLowWaiting, total, beforeHigh, lowWaiting)
		}
	}
	check("all waiting", 200, 100, 30)
	if plan := step(t, s); !slices.Equal(plan, []planned{{1, 64}}) {
		t.Fatalf("plan %v, want a's first 64-token chunk", plan)
	}
	check("a running mid-prefill", 136, 36, 30)
	// A running sheddable prefill is ahead of a high request too: its chunks come first.
	s2 := newTestSim(t, func(c *Config) { c.MaxNumBatchedTokens = 64 })
	submitPrio(t, s2, "c", 300, 5, -2)
	step(t, s2)
	submitPrio(t, s2, "a", 100, 5, 1)
	if st := s2.State(); st.QueuedBeforeHigh != 236+100 || st.QueuedLowWaiting != 0 {
		t.Errorf("a sheddable prefill running: before high %d, low waiting %d; want 336 and 0", st.QueuedBeforeHigh, st.QueuedLowWaiting)
	}
}
