package node_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/agent"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet"
	"github.com/kvmesh/kvmesh/testnet/loadgen"
)

// benchEnv reads a float knob of BenchmarkAgents from the environment.
func benchEnv(name string, def float64) float64 {
	if v, err := strconv.ParseFloat(os.Getenv("KVMESH_AGENTS_"+name), 64); err == nil {
		return v
	}
	return def
}

// BenchmarkAgents runs the load generator's agent workload on a 2-node testnet whose KV pools
// are smaller than the agents' combined context, three ways side by side: agent admission,
// request-level admission only, and no admission. Each sub-benchmark iteration is one run;
// use -benchtime 1x.
//
// The work is fixed and the same in every mode: STEPS agent steps in sessions that start at
// RATE steps/s, every session runs to its last step (a refused step is retried after its
// Retry-After, the way an agent framework does, and the queue TTL is long), so each mode
// completes the same steps and the figure is steps over the time it took. With SESSIONS > 0
// the load is a closed loop instead: that many sessions at all times, the next starting as one
// ends, for DURATION seconds, the figure the steps completed within that window over its
// length. That figure is not comparable across modes: a mode that keeps refusing the long
// contexts of old sessions completes more of the short first steps of new ones.
//
// The defaults are the thrashing regime: tool results 8 times the workload's default (800 to
// 6,400 tokens, as agents reading files get), so contexts reach 30k tokens and recomputing
// one costs more than decoding a step's output; 157 sessions start within a second, and their
// combined context (about 2.9M tokens at their last steps) is 11 times the two pools of 8,192
// blocks (131k tokens) each. Knobs (env KVMESH_AGENTS_*): RATE steps/s, STEPS, SESSIONS,
// DURATION s, KV blocks per node, TOOLSCALE, SCALE (sim time scale), TOOLWAIT ms, INTERVAL
// (agent control interval, ms), WINDOW (MaxWindow; 0 leaves the default), FIXED (a window of
// exactly FIXED agents a home, no controller: the reference the controller is measured
// against), TRACE (log each node's window, ceiling, signals and engine every second), RECORDS
// (write each mode's request records to RECORDS.MODE.jsonl).
//
//	go test -run '^$' -bench Agents -benchtime 1x -timeout 30m ./node/
func BenchmarkAgents(b *testing.B) {
	var (
		sessions = int(benchEnv("SESSIONS", 0))
		duration = time.Duration(benchEnv("DURATION", 120) * float64(time.Second))
		rate     = benchEnv("RATE", 900)
		steps    = int(benchEnv("STEPS", 900))
		kv       = int(benchEnv("KV", 8192))
		scale    = benchEnv("SCALE", 1)
		toolWait = time.Duration(benchEnv("TOOLWAIT", 1000)) * time.Millisecond
		tools    = benchEnv("TOOLSCALE", 8)
		window   = int(benchEnv("WINDOW", 0)) // 0: the controller's default bounds
	)
	const patience = 10 * time.Minute // queue TTL and client timeout: nothing is given up
	modes := []struct {
		name      string
		agents    bool
		admission string
	}{
		{"agent", true, node.AdmissionKvmesh},
		{"request", false, node.AdmissionKvmesh},
		{"none", false, node.AdmissionNone},
	}
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			// The engines' vLLM-named metrics (preemptions), which a node keeps off its /metrics.
			simRegs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
			tn, err := testnet.Start(ctx, testnet.Config{Nodes: 2, Fast: true, Configure: func(i int, cfg *node.Config) {
				cfg.Sim.Registerer = simRegs[i]
				cfg.GPU = "none"
				cfg.Sim.TimeScale = scale
				cfg.Sim.KVBlocks = kv
				cfg.DrainTimeout = 5 * time.Second
				cfg.Admission = m.admission
				cfg.Admit.Queue.TTL = admit.Duration(patience)
				if m.agents {
					c := agent.DefaultConfig()
					// Every session says when it is done (X-Kvmesh-Agent-Final); this only bounds
					// how long an agent that lost its session holds a slot.
					c.IdleTimeout = 10 * toolWait
					if window > 0 {
						c.Controller.MaxWindow, c.Controller.InitialWindow = window, min(window, c.Controller.InitialWindow)
					}
					if fixed := int(benchEnv("FIXED", 0)); fixed > 0 {
						c.Controller.MinWindow, c.Controller.InitialWindow, c.Controller.MaxWindow = fixed, fixed, fixed
					}
					cfg.Agents = &c
					cfg.AgentInterval = time.Duration(benchEnv("INTERVAL", 500)) * time.Millisecond
				}
			}})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = tn.Close() })
			if err := tn.WaitConverged(ctx); err != nil {
				b.Fatal(err)
			}
			lc := loadgen.DefaultConfig()
			lc.Targets, lc.Model, lc.Workload = tn.URLs(), node.DefaultModel, "agents"
			lc.Rate, lc.ToolWait, lc.ToolScale = rate, toolWait, tools
			lc.Timeout, lc.Retries, lc.MaxRetryWait = patience, 1000, time.Second
			planned := "a closed loop"
			if sessions > 0 {
				lc.Sessions, lc.Duration = sessions, duration
			} else {
				lc.Duration, lc.MaxRequests = 0, steps
				plan, err := loadgen.Plan(lc)
				if err != nil {
					b.Fatal(err)
				}
				lc.MaxRequests = 0
				for _, it := range plan {
					lc.MaxRequests += it.Agent.Steps // exactly the planned sessions, every step
				}
				planned = fmt.Sprintf("%d sessions, %d steps", len(plan), lc.MaxRequests)
			}
			if path := os.Getenv("KVMESH_AGENTS_RECORDS"); path != "" {
				f, err := os.Create(path + "." + m.name + ".jsonl")
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = f.Close() })
				lc.Requests = f
			}
			var done, outTok, completed, prompt, cached, recomputed int
			var elapsed float64
			for b.Loop() {
				stop := make(chan struct{})
				var sampled sync.WaitGroup
				if m.agents && os.Getenv("KVMESH_AGENTS_TRACE") != "" {
					sampled.Go(func() { traceWindows(b, tn, stop) })
				}
				rep, err := loadgen.Run(context.Background(), lc)
				close(stop)
				sampled.Wait()
				if err != nil {
					b.Fatal(err)
				}
				if rep.Failed > 0 || rep.Refused > 0 {
					b.Errorf("%s: %d steps failed %v, %d refused %v: every step must be answered", m.name, rep.Failed, rep.Failures, rep.Refused, rep.RefusalsByReason)
				}
				// The throughput: steps and their output over the window they completed in.
				if sessions > 0 {
					done, outTok, elapsed = done+rep.CompletedInWindow, outTok+rep.OutputTokensInWindow, elapsed+rep.Window
				} else {
					done, outTok, elapsed = done+rep.Completed, outTok+rep.OutputTokens, elapsed+rep.Elapsed
				}
				completed += rep.Completed
				prompt += rep.PromptTokens
				cached += rep.CachedTokens
				recomputed += rep.RecomputedTokens
				b.Logf("%s: %s, sent %d completed %d (%d in the window) retried %d in %.1fs",
					m.name, planned, rep.Sent, rep.Completed, rep.CompletedInWindow, rep.Retried, rep.Elapsed)
			}
			if done == 0 {
				b.Fatal("no agent step completed")
			}
			b.ReportMetric(float64(done)/elapsed, "steps/s")
			b.ReportMetric(float64(outTok)/elapsed, "out-tok/s")
			b.ReportMetric(float64(cached)/float64(max(prompt, 1)), "hit-ratio")
			// Prompt tokens the engines computed a step: new tool output plus any evicted context.
			b.ReportMetric(float64(prompt-cached)/float64(completed), "prefilled-tok/step")
			// Of those, the agents' earlier context computed again (the client's count).
			b.ReportMetric(float64(recomputed)/float64(completed), "recomputed-tok/step")
			b.ReportMetric(sumGathered(b, simRegs, "vllm:num_preemptions_total")/float64(b.N), "preemptions")
			b.Logf("%s: refusals by code, summed over the nodes (retried steps included): %v", m.name, gatheredBy(b, tn, "kvmesh_requests_refused_total", "code"))
			if m.agents {
				b.ReportMetric(gathered(b, tn, "kvmesh_agent_pauses_total")/float64(b.N), "pauses")
				b.Logf("summed over the nodes: window %v active %v paused %v waiting %v U %.2f H %.2f finished %v swept %v",
					gathered(b, tn, "kvmesh_agent_window"), gathered(b, tn, "kvmesh_agent_active"),
					gathered(b, tn, "kvmesh_agent_paused"), gathered(b, tn, "kvmesh_agent_waiting"),
					gathered(b, tn, "kvmesh_agent_kv_use"), gathered(b, tn, "kvmesh_agent_hit_rate"),
					gathered(b, tn, "kvmesh_agent_finished_total"), gathered(b, tn, "kvmesh_agent_swept_total"))
				// How the agents split over the homes: an agent homed on two nodes (two
				// ingresses placed it before gossip) is registered on both and released by one.
				for i, n := range tn.Nodes {
					one := &testnet.Net{Nodes: []*node.Node{n}}
					b.Logf("home %s: admitted %v finished %v swept %v released %v", testnet.Name(i), gathered(b, one, "kvmesh_agent_admitted_total"),
						gathered(b, one, "kvmesh_agent_finished_total"), gathered(b, one, "kvmesh_agent_swept_total"),
						gathered(b, one, "kvmesh_agent_released_total"))
				}
			}
		})
	}
}

// traceWindows logs each node's window, agents and signals every second until stop closes.
func traceWindows(b *testing.B, tn *testnet.Net, stop chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		line := ""
		for _, n := range tn.Nodes {
			one := &testnet.Net{Nodes: []*node.Node{n}}
			line += fmt.Sprintf(" | reg %v W %v cap %v act %v pau %v wait %v U %.2f next %.2f H %.2f run %v kv %.2f", gathered(b, one, "kvmesh_agent_registered"), gathered(b, one, "kvmesh_agent_window"),
				gathered(b, one, "kvmesh_agent_window_cap"), gathered(b, one, "kvmesh_agent_active"), gathered(b, one, "kvmesh_agent_paused"),
				gathered(b, one, "kvmesh_agent_waiting"), gathered(b, one, "kvmesh_agent_kv_use"),
				gathered(b, one, "kvmesh_agent_kv_use_next"), gathered(b, one, "kvmesh_agent_hit_rate"),
				gathered(b, one, "kvmesh_engine_requests_running"), gathered(b, one, "kvmesh_engine_kv_use_ratio"))
		}
		b.Log(line)
	}
}

// gathered sums metric family name over the testnet's nodes.
func gathered(tb testing.TB, tn *testnet.Net, name string) float64 {
	tb.Helper()
	regs := make([]*prometheus.Registry, len(tn.Nodes))
	for i, n := range tn.Nodes {
		regs[i] = n.Registry()
	}
	return sumGathered(tb, regs, name)
}

// sumGathered sums metric family name over regs.
func sumGathered(tb testing.TB, regs []*prometheus.Registry, name string) float64 {
	tb.Helper()
	var sum float64
	for _, reg := range regs {
		fams, err := reg.Gather()
		if err != nil {
			tb.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() != name {
				continue
			}
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// gatheredBy sums metric family name over the testnet's nodes by the value of label.
func gatheredBy(tb testing.TB, tn *testnet.Net, name, label string) map[string]float64 {
	tb.Helper()
	out := map[string]float64{}
	for _, n := range tn.Nodes {
		fams, err := n.Registry().Gather()
		if err != nil {
			tb.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() != name {
				continue
			}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == label {
						out[l.GetValue()] += m.GetCounter().GetValue() + m.GetGauge().GetValue()
					}
				}
			}
		}
	}
	return out
}
