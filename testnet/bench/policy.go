package bench

import (
	"slices"

	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/node"
)

// Policy is one routing and admission setup, applied to every node of a run.
type Policy struct {
	// Name labels the policy in the table, the JSON and the plot; it must be unique in a run.
	Name string `json:"name"`
	// Route is the routing policy (route.PolicyNames).
	Route string `json:"route"`
	// Admission is node.AdmissionKvmesh, node.AdmissionNone or node.AdmissionQueueCap.
	Admission string `json:"admission"`
	// QueueCap is the per-engine waiting limit of node.AdmissionQueueCap (0 = the node's default).
	QueueCap int `json:"queue_cap,omitempty"`
	// EngineScheduling is the scheduling policy of the policy's simulated engines
	// (sim.Config.SchedulingPolicy: sim.SchedulingPriority or sim.SchedulingFCFS). Empty takes
	// Config.BaselineScheduling, except for KvmeshPolicy, whose engines always schedule by
	// priority; a Run's Result records the setting each policy ran with.
	EngineScheduling string `json:"engine_scheduling,omitempty"`
	// Roles gives node i of the policy's testnet the role Roles[i] (testnet.Config.Roles:
	// mixed, prefill or decode); empty is a mesh of mixed nodes.
	Roles []string `json:"roles,omitempty"`
	// NoDelegate turns delegated routing off on every node (route.delegate: false).
	NoDelegate bool `json:"no_delegate,omitempty"`
}

// KvmeshPolicy is the name of the policy Result.Ratios compares with the others.
const KvmeshPolicy = "kvmesh"

// DisaggPolicy is the name of kvmesh on a disaggregated testnet (Config.Disaggregated).
const DisaggPolicy = "kvmesh-disagg"

// DisaggregatedPolicies returns the policies of a disaggregated benchmark: kvmesh on mixed nodes,
// then kvmesh on nodes of roles, the same GPU count.
func DisaggregatedPolicies(roles []string) []Policy {
	km, _ := PolicyByName(KvmeshPolicy)
	dis := km
	dis.Name, dis.Roles = DisaggPolicy, slices.Clone(roles)
	return []Policy{km, dis}
}

// DefaultQueueCap is the queue cap of the "cache-aware-qcap" policy: requests waiting in one
// engine beyond which it refuses with 429, as a TGI- or vLLM-style fixed queue limit does.
const DefaultQueueCap = 64

// DefaultPolicies returns the policies a user would otherwise run, then kvmesh:
// round-robin and least-load without admission, cache-aware without admission (what
// cache-aware routers do), cache-aware with a fixed per-engine queue cap, and kvmesh routing
// with kvmesh admission.
func DefaultPolicies() []Policy {
	return []Policy{
		{Name: "round-robin", Route: route.PolicyRoundRobin, Admission: node.AdmissionNone},
		{Name: "least-load", Route: route.PolicyLeastLoad, Admission: node.AdmissionNone},
		{Name: "cache-aware", Route: route.PolicyCacheAware, Admission: node.AdmissionNone},
		{Name: "cache-aware-qcap", Route: route.PolicyCacheAware, Admission: node.AdmissionQueueCap, QueueCap: DefaultQueueCap},
		{Name: KvmeshPolicy, Route: route.PolicyKvmesh, Admission: node.AdmissionKvmesh},
	}
}

// PolicyByName returns the DefaultPolicies or MultiModelPolicies entry called name.
func PolicyByName(name string) (Policy, bool) {
	for _, p := range DefaultPolicies() {
		if p.Name == name {
			return p, true
		}
	}
	if name == NoDelegatePolicy {
		return MultiModelPolicies()[1], true
	}
	if name == LoRAAffinityPolicy.Name {
		return LoRAAffinityPolicy, true
	}
	return Policy{}, false
}

// PolicyNames lists the names of DefaultPolicies.
func PolicyNames() []string {
	var out []string
	for _, p := range DefaultPolicies() {
		out = append(out, p.Name)
	}
	return out
}
