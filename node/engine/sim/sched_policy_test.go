package sim

import (
	"fmt"
	"slices"
	"testing"
)

// TestSchedulingPolicy pins what Config.SchedulingPolicy changes: under priority a later
// high-priority request overtakes an earlier low-priority one in the waiting queue, preempts
// it for blocks when it waits and is spared when a running sequence needs a block; under fcfs
// (vLLM's default) the priorities are ignored: the earlier request is admitted first, the later
// one waits for blocks without preempting, and a running sequence short of blocks preempts the
// latest arrival whatever its priority.
func TestSchedulingPolicy(t *testing.T) {
	type outcome struct {
		plan     []planned
		waiting  []uint64
		preempts uint64
	}
	tests := []struct {
		name string
		mod  func(*Config)
		// run submits the requests and steps the Sim up to the step the outcome is read after.
		run      func(t *testing.T, s *Sim) []planned
		priority outcome
		fcfs     outcome
	}{
		{
			// One seat: a low request, then a high one, both waiting.
			name: "waiting order",
			mod:  func(c *Config) { c.MaxNumSeqs = 1 },
			run: func(t *testing.T, s *Sim) []planned {
				submitPrio(t, s, "low", 16, 10, -1)
				submitPrio(t, s, "high", 16, 10, 1)
				return step(t, s)
			},
			priority: outcome{plan: []planned{{2, 16}}, waiting: []uint64{1}},
			fcfs:     outcome{plan: []planned{{1, 16}}, waiting: []uint64{2}},
		},
		{
			// A low request of 30 tokens holds 2 of 4 blocks; a high one of 40 needs 3.
			name: "preemption for a waiting request",
			mod:  func(c *Config) { c.KVBlocks = 4 },
			run: func(t *testing.T, s *Sim) []planned {
				submitPrio(t, s, "low", 30, 10, -1)
				if plan := step(t, s); !slices.Equal(plan, []planned{{1, 30}}) {
					t.Fatalf("first step %v, want the low request's prefill", plan)
				}
				submitPrio(t, s, "high", 40, 5, 1)
				plan, d, _ := schedule(s, s.scheduleLocked)
				complete(s, d)
				return plan
			},
			priority: outcome{plan: []planned{{2, 40}}, waiting: []uint64{1}, preempts: 1},
			fcfs:     outcome{plan: []planned{{1, 1}}, waiting: []uint64{2}},
		},
		{
			// Three sequences of one block each decode in a pool of four: the second to need a
			// block preempts one victim. The earliest is low, the later two high.
			name: "preemption for a running sequence",
			mod:  func(c *Config) { c.KVBlocks, c.MaxNumSeqs = 4, 3 },
			run: func(t *testing.T, s *Sim) []planned {
				for i, p := range []int{-1, 1, 1} {
					submitPrio(t, s, fmt.Sprint("victim-", i), 16, 10, p)
				}
				if plan := step(t, s); len(plan) != 3 {
					t.Fatalf("first step %v, want all three prefilled", plan)
				}
				return step(t, s)
			},
			priority: outcome{plan: []planned{{2, 1}, {3, 1}}, waiting: []uint64{1}, preempts: 1},
			fcfs:     outcome{plan: []planned{{1, 1}, {2, 1}}, waiting: []uint64{3}, preempts: 1},
		},
	}
	for _, tt := range tests {
		for _, policy := range SchedulingPolicies {
			want := tt.priority
			if policy == SchedulingFCFS {
				want = tt.fcfs
			}
			t.Run(tt.name+"/"+policy, func(t *testing.T) {
				s := newTestSim(t, func(c *Config) { tt.mod(c); c.SchedulingPolicy = policy })
				plan := tt.run(t, s)
				_, waiting := queues(s)
				if !slices.Equal(plan, want.plan) || !slices.Equal(waiting, want.waiting) || preemptions(s) != want.preempts {
					t.Errorf("plan %v waiting %v preemptions %d; want %v, %v and %d",
						plan, waiting, preemptions(s), want.plan, want.waiting, want.preempts)
				}
			})
		}
	}
}

// TestStateUnderFCFS pins that an fcfs engine does not claim priority scheduling: its state
// says PriorityScheduling false and leaves the class split zero, so that admission counts all
// of its queued prefill ahead of every request (route.QueuedAhead), as the engine runs it.
func TestStateUnderFCFS(t *testing.T) {
	s := newTestSim(t, func(c *Config) { c.MaxNumBatchedTokens = 64; c.SchedulingPolicy = SchedulingFCFS })
	submitPrio(t, s, "a", 100, 5, 1)
	submitPrio(t, s, "b", 50, 5, 0)
	submitPrio(t, s, "c", 30, 5, -2)
	step(t, s)
	st := s.State()
	if st.PriorityScheduling || st.QueuedBeforeHigh != 0 || st.QueuedLowWaiting != 0 || st.QueuedPrefillTokens != 36+50+30 {
		t.Errorf("state %+v: want no priority scheduling, no class split and 116 tokens queued", st)
	}
	if p := newTestSim(t, nil).State(); !p.PriorityScheduling {
		t.Error("the default engine does not report priority scheduling")
	}
}
