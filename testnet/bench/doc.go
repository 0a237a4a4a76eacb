// Package bench is the goodput benchmark behind `kvmesh bench`: it measures what a mesh of
// simulated GPU nodes delivers past saturation under each routing and admission policy, on the
// same workload, so the policies can be compared at 0.5×, 1.0× and 1.5× of capacity.
//
// # Method
//
// Run first measures capacity once, on a dedicated probe testnet running ProbePolicy:
// cache-aware routing without admission, what a fleet runs without kvmesh. Capacity is the
// highest offered rate of the workload at which that baseline still meets ProbeAttainment (90%)
// of SLOs: the knee of its goodput curve, the usual definition of a serving system's SLO
// capacity. A closed-loop probe is no yardstick for a mix whose costs span three orders of
// magnitude: short requests cycle through its slots while long ones park in them, so what it
// counts depends on its concurrency. The probe offers ProbeRate for ProbeDuration, doubles (or
// halves) the rate until one rate meets the target and its double does not, then bisects that
// octave ProbeSteps times. A step is cut a batch TTFT SLO after its window; what it cut missed.
//
// Then, for each Policy, a fresh testnet is started with that policy on every node (runs of
// different policies share no cache), and for each load L the workload is replayed at L ×
// capacity, spread round-robin over every node's URL (every node is an ingress). Loads of one
// policy run back to back on the same testnet, in the order given, with the same seed.
//
// Before each measured run a warm-up (Warmup, 10 s by default; none for a Trace) runs at the
// same load on the same testnet, unmeasured: another stream of the workload's requests
// (loadgen.Config.Variant) over the same shared texts, waited for, so that the measured window
// opens with warm caches, measured drain rates and empty queues.
//
// Each run's arrival window (Duration, a minute by default) is long on purpose. Past
// saturation the backlog of a policy without admission grows for as long as the overload
// lasts, so a window of a few seconds mostly measures how much backlog fits under the SLOs.
// The probe's steps are shorter (ProbeDuration, 20 s): below the knee there is no backlog to
// build, and the search takes about seven steps.
//
// Engines says where the simulated engines run. Embedded (the default), each node drives its
// engine in process. External, each node runs in front of its own standalone engine (what
// kvmesh engine serves) and drives it over HTTP as it drives vLLM: it reads the engine's load
// from its vLLM metrics and knows what it caches only from its residency model of the engine's
// prefix cache, so a run measures the external path, not the engines, against the embedded one.
//
// Every policy's engines schedule by priority unless BaselineScheduling is sim.SchedulingFCFS:
// then the engines of every policy but KvmeshPolicy, and the probe's, run first come first
// served, as vLLM's and SGLang's default does, and kvmesh's keep priority scheduling (a Policy
// may name its own, EngineScheduling). Result and its table record which ran.
//
// Each Row sets its classes' attainment beside their bound (ClassBound, from the run's request
// records): what an ideal admission could have given each class with the service the mesh
// performed while the class's requests could still meet their target. The unit of service is a
// good request's first token: a request is good only if its first token came within its TTFT
// target, so whether a request the mesh served well could have been a class c request instead
// is decided at that instant (a c request must have arrived by then and still be within its
// target); completions would drop the service that started in time and ended after the last
// target, and tokens would count as capacity the decode steps that run long after a class's
// last arrival. Good first tokens are matched to requests, each inside [its arrival, its
// arrival + its TTFT target], greedily in priority order (the matchable sets form a
// transversal matroid, so the greedy order is exact): class c gets the most of its requests
// matched given the classes above it. So a class served only in the drain after the last
// arrival does not raise the bound of a class whose target ended before it, and with one
// class, or a class whose target spans the run, the bound is the run's good requests against
// the class's sent, what ClassBound.BoundServed keeps for every class. Its cache hit ratio stands beside a pooled-LRU oracle's on the same
// requests: one LRU cache of Nodes × KVBlocks blocks fed every planned prompt's chained block
// hashes in arrival order, warm-ups and earlier loads included, computed offline from the plan
// (none for the agents workload, whose later prompts carry the server's answers). It has no
// node boundaries, no KV held by running requests and no prefill delay, so routing over that
// much memory does not do much better under LRU; it is not an optimal (Belady) bound.
//
// Models above 1 runs every testnet as a multi-model mesh: node i serves ModelName(i mod
// Models) alone, each request asks for the model of its conversation (loadgen.Config.Models:
// requests that could reuse one another's prefix ask for one model) and enters round-robin
// through every node, so a model's traffic enters through its own nodes and through other
// models' alike. Each Row then sets the requests entering through other models' nodes, which
// kvmesh delegates to a member of their model's domain, against those entering through their
// own model's (Row.Entries, Row.OtherOverOwn: cache hit ratio, attainment, goodput, and the
// median TTFT the hop adds). Its default policies are kvmesh and NoDelegatePolicy, kvmesh
// with delegation off; the oracle is not computed (each model's caches are its own).
//
// Disaggregated runs DisaggPolicy, kvmesh on nodes of those roles (prefill, decode, mixed),
// beside kvmesh on as many mixed nodes; each run then also reports its split and whole
// dispatches, a per-pool timeline of accepted and refused requests (see poolCounter) and each
// class's latency by the path its requests took (PathLatency).
//
// A Result prints as a table (WriteTable), JSON, an SVG plot of goodput and each class's p99
// TTFT against load, a panel per class (WriteSVG), and one self-contained HTML page of plots
// and tables (WriteHTML).
//
// # Time
//
// TimeScale speeds the simulated engines up. Everything the workload carries is scaled with it
// so that the simulated GPUs see the same situation as at TimeScale 1: the SLOs (a TTFT SLO of
// 2 s at TimeScale 4 becomes 500 ms of wall time), the clients' patience (ClientTimeout) and
// agents' tool waits are divided by TimeScale, so are the nodes' admission durations that stand
// for the hardware's time (queue TTL, target TTFT, drain window, class SLO defaults), and gossip
// runs with the testnet's fast timers (its failure detector less hasty, so that a burst that
// saturates this machine does not get a healthy peer declared dead).
// Duration and ProbeDuration are wall time. Result's table is in simulated time: rates are wall
// rates ÷ TimeScale, latencies wall latencies × TimeScale, so they read as figures of the
// modelled hardware; each Row keeps loadgen's raw Report in wall time. What is not simulated
// (HTTP, QUIC, gossip, the load generator itself, all sharing this machine's cores) is not
// scaled, so a high TimeScale inflates the mesh's own overhead in simulated time, and past
// some TimeScale the machine's own latency, not the simulated engines, decides who meets a
// TTFT SLO. The default is real time. docs/performance.md describes the method and records
// every run.
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
// Zero fields of a Config take DefaultConfig's values, except TraceBatchFraction, Warmup,
// Progress and Logger, whose zero values mean "none", and SharedPrefix, whose zero fields take
// loadgen's defaults but for its zero follow-ups and popularity skew. A zero Result is an empty result.
package bench
