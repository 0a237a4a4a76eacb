package bench

import (
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/engine/sim"
	"github.com/kvmesh/kvmesh/testnet/loadgen"
)

// The adapters workload (loadgen.WorkloadAdapters) runs on engines that know every adapter of
// the workload (sim lora_modules) with Config.MaxLoRAs GPU slots each, so any node can swap
// any adapter in; it compares kvmesh with LoRAAffinityPolicy and reports each run's adapter
// loads per 1,000 requests, read from the engines' kvmesh_sim_lora_loads_total.

// LoRAAffinityPolicy is the adapters workload's baseline: LoRA-affinity routing (resident
// first, then a free slot, the least loaded within each; no prefixes, no SLOs) without
// admission, on first-come-first-served engines.
var LoRAAffinityPolicy = Policy{Name: route.PolicyLoRAAffinity, Route: route.PolicyLoRAAffinity, Admission: node.AdmissionNone,
	EngineScheduling: sim.SchedulingFCFS}

// AdapterPolicies returns the adapters workload's default policies: LoRAAffinityPolicy, then kvmesh.
func AdapterPolicies() []Policy {
	km, _ := PolicyByName(KvmeshPolicy)
	return []Policy{LoRAAffinityPolicy, km}
}

// adapters reports whether the benchmark runs the adapters workload.
func (b *bencher) adapters() bool {
	return b.cfg.Trace == "" && b.cfg.Workload == loadgen.WorkloadAdapters
}

// configureAdapters gives node i's engine every adapter of the workload and the slots, its
// metrics a registry of its own (regs[i]) the benchmark reads the loads from, and routing
// the engine's load time, in wall time.
func (b *bencher) configureAdapters(nc *node.Config, reg *prometheus.Registry) {
	nc.Sim.LoRAModules = make(map[string]string, b.cfg.SharedPrefix.Tenants)
	for t := range b.cfg.SharedPrefix.Tenants {
		name := loadgen.AdapterName(t)
		nc.Sim.LoRAModules[name] = "/lora/" + name
	}
	if b.cfg.MaxLoRAs > 0 {
		nc.Sim.MaxLoRAs = b.cfg.MaxLoRAs
	}
	nc.Sim.Registerer = reg
	nc.Route.AdapterLoadTime = scaleDur(sim.DefaultConfig().LoRALoadTime, b.cfg.TimeScale)
}

// adapterLoads sums kvmesh_sim_lora_loads_total over regs.
func adapterLoads(regs []*prometheus.Registry) (float64, error) {
	sum := 0.0
	for _, reg := range regs {
		mfs, err := reg.Gather()
		if err != nil {
			return 0, fmt.Errorf("bench: engine metrics: %w", err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "kvmesh_sim_lora_loads_total" {
				for _, m := range mf.GetMetric() {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum, nil
}

// writeAdapterLoads writes the adapter loads per 1,000 requests of the rows that counted them.
func writeAdapterLoads(rows []Row, p func(string, ...any)) {
	var lines []string
	for _, row := range rows {
		if row.AdapterLoadsPer1k != nil {
			lines = append(lines, fmt.Sprintf("%s\t%.2g\t%.0f\n", row.Policy, row.Load, *row.AdapterLoadsPer1k))
		}
	}
	if len(lines) > 0 {
		p("\npolicy\tload\tadapter loads per 1,000 requests\n")
		p("%s", strings.Join(lines, ""))
	}
}
