package node_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

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
// use -benchtime 1x. Knobs (env KVMESH_AGENTS_*): RATE steps/s, KV blocks per node, SCALE
// (sim time scale), TOOLWAIT ms, DURATION s, WINDOW (MaxWindow; 0 leaves the default).
//
//	go test -run '^$' -bench Agents -benchtime 1x ./node/
func BenchmarkAgents(b *testing.B) {
	var (
		rate     = benchEnv("RATE", 80)
		kv       = int(benchEnv("KV", 1024))
		scale    = benchEnv("SCALE", 1)
		toolWait = time.Duration(benchEnv("TOOLWAIT", 1000)) * time.Millisecond
		duration = time.Duration(benchEnv("DURATION", 12)) * time.Second
		window   = int(benchEnv("WINDOW", 0)) // 0: the controller's default bounds
	)
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
			tn, err := testnet.Start(ctx, testnet.Config{Nodes: 2, Fast: true, Configure: func(i int, cfg *node.Config) {
				cfg.GPU = "none"
				cfg.Sim.TimeScale = scale
				cfg.Sim.KVBlocks = kv
				cfg.DrainTimeout = 5 * time.Second
				cfg.Admission = m.admission
				cfg.Admit.Queue.TTL = admit.Duration(duration)
				if m.agents {
					c := agent.DefaultConfig()
					// Agents end silently: a finished agent holds its slot until this passes,
					// so it is a few tool waits, not minutes.
					c.IdleTimeout = 4 * toolWait
					if window > 0 {
						c.Controller.MaxWindow, c.Controller.InitialWindow = window, min(window, c.Controller.InitialWindow)
					}
					cfg.Agents = &c
					cfg.AgentInterval = 100 * time.Millisecond
				}
			}})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = tn.Close() })
			if err := tn.WaitConverged(ctx); err != nil {
				b.Fatal(err)
			}
			var steps, outTok, prompt, cached int
			var elapsed float64
			for b.Loop() {
				lc := loadgen.DefaultConfig()
				lc.Targets, lc.Model, lc.Workload = tn.URLs(), node.DefaultModel, "agents"
				lc.Rate, lc.Duration, lc.ToolWait, lc.Timeout = rate, duration, toolWait, 2*duration
				rep, err := loadgen.Run(context.Background(), lc)
				if err != nil {
					b.Fatal(err)
				}
				if k := rep.Kinds["agent"]; k != nil {
					steps += k.Completed
				}
				outTok += rep.OutputTokens
				prompt += rep.PromptTokens
				cached += rep.CachedTokens
				elapsed += rep.Elapsed
				b.Logf("%s: sent %d completed %d refused %v failed %v", m.name, rep.Sent, rep.Completed, rep.RefusalsByReason, rep.Failures)
			}
			if steps == 0 {
				b.Fatal("no agent step completed")
			}
			b.ReportMetric(float64(steps)/elapsed, "steps/s")
			b.ReportMetric(float64(outTok)/elapsed, "out-tok/s")
			b.ReportMetric(float64(cached)/float64(max(prompt, 1)), "hit-ratio")
			// Prompt tokens the engine had to compute: new tool output plus any evicted context.
			b.ReportMetric(float64(prompt-cached)/float64(b.N), "prefilled-tok")
			if m.agents {
				b.ReportMetric(gathered(b, tn, "kvmesh_agent_recomputed_tokens_total")/float64(b.N), "recomputed-tok")
				b.ReportMetric(gathered(b, tn, "kvmesh_agent_recompute_avoided_tokens_total")/float64(b.N), "avoided-tok")
				b.ReportMetric(gathered(b, tn, "kvmesh_agent_pauses_total")/float64(b.N), "pauses")
				b.Logf("summed over the nodes: window %v active %v paused %v waiting %v U %.2f H %.2f", gathered(b, tn, "kvmesh_agent_window"),
					gathered(b, tn, "kvmesh_agent_active"), gathered(b, tn, "kvmesh_agent_paused"), gathered(b, tn, "kvmesh_agent_waiting"),
					gathered(b, tn, "kvmesh_agent_kv_use"), gathered(b, tn, "kvmesh_agent_hit_rate"))
			}
		})
	}
}

// gathered sums metric family name over the testnet's nodes.
func gathered(tb testing.TB, tn *testnet.Net, name string) float64 {
	tb.Helper()
	var sum float64
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
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return sum
}
