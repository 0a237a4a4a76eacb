// Package bench is the goodput benchmark behind `kvmesh bench`: it measures what a mesh of
// simulated GPU nodes delivers past saturation under each routing and admission policy, on the
// same workload, so the policies can be compared at 0.5×, 1.0× and 1.5× of capacity.
//
// # Method
//
// Run first measures capacity once, on a dedicated probe testnet (round-robin routing, no
// admission, so no policy's cache or refusals shape the yardstick). The probe is closed-loop:
// the workload is offered far faster than any mesh can serve it (ProbeRate) while loadgen keeps
// ProbeConcurrency requests in flight, which by default is every engine's max_num_seqs, so every
// engine's batch stays full and its queue non-empty, exactly as under an open-loop load well past
// saturation. After ProbeDuration the probe is cut. Capacity is the completed requests divided
// by (elapsed − mean E2E / 2): the half-request each slot loses when the probe is cut would
// otherwise bias the rate low. If the workload ran dry before the cut, the probe rate is doubled
// and the probe repeated.
//
// Then, for each Policy, a fresh testnet is started with that policy on every node (runs of
// different policies share no cache), and for each load L the workload is replayed at L ×
// capacity, spread round-robin over every node's URL (every node is an ingress). Loads of one
// policy run back to back on the same testnet, in the order given, with the same seed.
//
// # Time
//
// TimeScale speeds the simulated engines up so that a run takes minutes. Everything the
// workload carries is scaled with it so that the simulated GPUs see the same situation as at
// TimeScale 1: the SLOs (a TTFT SLO of 2 s at TimeScale 10 becomes 200 ms of wall time) and
// agents' tool waits are divided by TimeScale, so are the nodes' admission durations that stand
// for the hardware's time (queue TTL, target TTFT, drain window, class SLO defaults), and gossip
// runs with the testnet's fast timers.
// Duration and ProbeDuration are wall time. Result's table is in simulated time: rates are wall
// rates ÷ TimeScale, latencies wall latencies × TimeScale, so they read as figures of the
// modelled hardware; each Row keeps loadgen's raw Report in wall time. What is not simulated
// (HTTP, QUIC, gossip, the load generator itself, all sharing this machine's cores) is not
// scaled, so a high TimeScale inflates the mesh's own overhead in simulated time.
//
// With a Trace, the trace's own pacing is replaced: the replay's speed is chosen so that its mean
// rate over the arrival window is L × capacity; Speedup only sets the reference the multiplier is
// computed from, and Scale shrinks token lengths (which changes capacity, so it is applied to the
// probe too). TraceBatchFraction of trace requests are sent as the sheddable batch class.
//
// # Concurrency
//
// Run blocks until every run has finished; it may be called concurrently with different
// Configs (each starts its own testnets on free loopback ports), though runs then compete for
// the machine's cores. A Result is a plain value.
//
// # Zero value
//
// Zero fields of a Config take DefaultConfig's values, except TraceBatchFraction, Progress and
// Logger, whose zero values mean "none". A zero Result is an empty result.
package bench
