package metrics

import "github.com/prometheus/client_golang/prometheus"

// The outcomes of a migration, the values of kvmesh_migrations_total's label.
const (
	MigrationCompleted = "completed" // the continuation ran to its end
	MigrationFailed    = "failed"    // the continuation began but did not end: an error, or its owner failed too
	MigrationRefused   = "refused"   // not moved: past the limit, not continuable, or no node took it
)

// The causes of a migration, the values of kvmesh_migrations_total's cause label.
const (
	CauseOwner  = "owner"  // the owner node failed: its stream broke, or it closed it between two events
	CauseEngine = "engine" // an engine under a live node failed: this node's, or an owner's, which it reported
)

// Outcomes of kvmesh_route_disaggregated_total: the dispatch's choice in a mesh with prefill
// or decode nodes, then what became of each split request's halves.
const (
	DisaggSplit          = "split"                // dispatched on a pair
	DisaggWholeShort     = "whole_short"          // whole: the uncached prompt fits one step's chunk
	DisaggWholeLink      = "whole_link"           // whole: the transfer costs over half the prefill it moves
	DisaggWholeMixed     = "whole_mixed"          // whole: a mixed node is as fast and keeps its TPOT
	DisaggWholeNoPair    = "whole_no_pair"        // whole on a mixed node: no pair, or admission passed over the rule's pair or decode node
	DisaggDecodeShort    = "whole_decode_short"   // whole on a decode node: the uncached prompt fits one step's chunk
	DisaggPrefillBehind  = "whole_prefill_behind" // whole on a decode node: the prefill pool misses the TTFT target
	DisaggHandover       = "handover"             // a prefill node handed the prompt's KV over
	DisaggPrefillRetried = "prefill_retried"      // a prefill node refused or failed; another was tried
	DisaggPrefillFailed  = "prefill_failed"       // no prefill node handed over: whole candidates, the room or a 502
	DisaggDecodeRetried  = "decode_retried"       // a decode node refused or failed before its first byte; another was tried
	DisaggHandoverQueued = "handover_queued"      // every decode node refused the handover: it waited for decode room
	DisaggDecodeFailed   = "decode_failed"        // no decode node took the handover: the request ended with an error
)

var disaggOutcomes = []string{DisaggSplit, DisaggWholeShort, DisaggWholeLink, DisaggWholeMixed, DisaggWholeNoPair,
	DisaggDecodeShort, DisaggPrefillBehind, DisaggHandover, DisaggPrefillRetried, DisaggPrefillFailed, DisaggDecodeRetried, DisaggHandoverQueued, DisaggDecodeFailed}

// Results of the retry budget (kvmesh_forward_retries_total's label).
const (
	RetryAllowed   = "allowed"
	RetryExhausted = "budget_exhausted"
)

// Reload results, the values of kvmesh_config_reloads_total's result label.
const (
	ReloadOK    = "ok"
	ReloadError = "error"
)

// Label values of kvmesh_config_files_missing_total.
const (
	FileConfig  = "config"
	FileAPIKeys = "api_keys"
)

// The outcomes of kvmesh_route_delegated_total.
const (
	DelegateAnswered = "delegated"   // (ingress) the delegate took the request and answered it
	DelegateFallback = "fallback"    // (ingress) the delegate refused the hop or was unreachable: routed here
	DelegateNone     = "no_delegate" // (ingress) no live member of the domain to hand it to: routed here
	DelegateServed   = "served"      // (delegate) a request another node handed here, routed here
)

var delegateOutcomes = []string{DelegateAnswered, DelegateFallback, DelegateNone, DelegateServed}

func newDelegated() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_route_delegated_total",
		Help: "Requests for a model the ingress does not serve, handed to a member of the model's domain to route, by outcome: at the ingress delegated (the delegate answered), fallback (it refused the hop, was unreachable or failed before its first byte, so the ingress routed the request itself) or no_delegate (no live member to hand it to); at the delegate served.",
	}, []string{"outcome"})
	for _, o := range delegateOutcomes {
		c.WithLabelValues(o)
	}
	return c
}
