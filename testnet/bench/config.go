package bench

import (
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/engine/sim"
	"github.com/kvmesh/kvmesh/testnet"
	"github.com/kvmesh/kvmesh/testnet/loadgen"
)

// Config describes a benchmark.
type Config struct {
	// Nodes is the testnet size of every run.
	Nodes int
	// Models, if above 1, makes every testnet a multi-model mesh: node i serves ModelName(i mod
	// Models) alone, each request asks for its conversation's model (loadgen.Config.Models)
	// and enters round-robin through every node, its own model's or another's, and each Row
	// breaks its requests down by entry (Row.Entries). Policies then defaults to
	// MultiModelPolicies. 0 is one model.
	Models int
	// Engines is where each node's simulated engine runs: testnet.EnginesEmbedded (the
	// default, in the node) or testnet.EnginesExternal (a standalone engine per node, reached
	// over HTTP as vLLM is, with the same Sim settings: TimeScale, KVBlocks, the policy's
	// EngineScheduling and Configure's).
	Engines string
	// TimeScale runs the simulated engines this many times faster than real time; SLOs and
	// tool waits are scaled with it (see the package doc).
	TimeScale float64
	// Workload names a loadgen workload; Trace, if set, replays a trace file instead, with
	// loadgen's Speedup and Scale.
	Workload string
	Trace    string
	Speedup  float64
	Scale    float64
	// TraceBatchFraction of trace requests are sent as the sheddable batch class (0: none).
	TraceBatchFraction float64
	// SharedPrefix shapes the shared-prefix and adapters workloads (loadgen.Config.SharedPrefix).
	SharedPrefix loadgen.SharedPrefix
	// MaxLoRAs is every engine's GPU adapter slots in the adapters workload (0: the engine's
	// default, 4).
	MaxLoRAs int
	// Loads are offered loads as multiples of the measured capacity.
	Loads []float64
	// Policies are compared, each on its own fresh testnet.
	Policies []Policy
	// Duration is each run's arrival window, in wall time (requests in flight are waited for).
	Duration time.Duration
	// Warmup is the arrival window (wall time) of the unmeasured run before each measured one,
	// at the same load on the same testnet: another stream of the workload's requests
	// (loadgen.Config.Variant) over the same shared texts, so that the measured window opens
	// on a mesh whose caches hold what the workload shares and whose admission has measured
	// its drain rates, without having seen the measured requests. Its requests are waited for:
	// the window opens with the queues empty. 0 runs none; a Trace is not warmed up (its
	// requests are all it has to warm with, and the measured run would repeat them).
	Warmup time.Duration
	// Seed makes the workload deterministic; every run uses the same.
	Seed int64
	// KVBlocks is every engine's KV pool in blocks, kept small so that the prefix cache is
	// contended and where a request runs matters.
	KVBlocks int
	// Interactive and Batch are the classes' SLOs in simulated time (divided by TimeScale on
	// the wire), each TTFT and TPOT above zero.
	Interactive, Batch loadgen.Class
	// ProbeDuration is the arrival window of each step of the capacity probe (wall time;
	// default 20 s, or Duration if shorter). ProbeRate is its first offered rate in simulated requests per second
	// (default 2.5 per node). ProbeAttainment is the SLO attainment that defines capacity
	// (default 0.9), and ProbeSteps how many bisection steps refine it (default 3).
	// Capacity, if set, is taken as measured (requests per simulated second) and the probe is
	// skipped: runs of one setup on different days compare at the same offered rates.
	Capacity        float64
	ProbeDuration   time.Duration
	ProbeRate       float64
	ProbeAttainment float64
	ProbeSteps      int
	// Configure, if set, adjusts node i's configuration after the benchmark's own settings.
	Configure func(i int, cfg *node.Config)
	// Progress receives one line per phase and loadgen's live progress line (nil = none).
	Progress io.Writer
	// Requests receives a line of JSON per request of every measured run (loadgen's
	// RequestRecord, its "run" POLICY@LOAD; times in wall seconds, like Row's Report), not of
	// the capacity probe (nil = none). A write error ends the benchmark after that run.
	Requests io.Writer
	// FittedTTFT runs the load with loadgen.Config.FittedTTFT: requests name no TTFT target.
	FittedTTFT bool
	// BaselineScheduling is the scheduling policy of the engines of every policy but
	// KvmeshPolicy that names none (Policy.EngineScheduling), and of the capacity probe's:
	// sim.SchedulingPriority (the default, as every engine ran before the setting) or
	// sim.SchedulingFCFS, vLLM's and SGLang's default, what a deployment without kvmesh runs.
	BaselineScheduling string
	// Disaggregated, if set, gives node i the role Disaggregated[i] (mixed, prefill or decode)
	// in a DisaggPolicy run beside kvmesh on mixed nodes: Nodes is its length, Policies defaults
	// to DisaggregatedPolicies (a DisaggPolicy is appended to policies given), and every run
	// reports its split and whole dispatches and its per-pool timeline.
	Disaggregated []string
	// LinkGBps is the bandwidth, in GB/s, of the link a split request's KV crosses
	// (sim.Config.LinkGBps, which the split rule also assumes; default the sim's).
	LinkGBps float64
	// BatchedTokens, if set, is every engine's step token budget (sim.Config.MaxNumBatchedTokens;
	// default the engine's), the decode nodes' but for DecodeBatchedTokens.
	BatchedTokens int
	// DecodeBatchedTokens, if set, is the step token budget (sim.Config.MaxNumBatchedTokens)
	// of the decode nodes of the DisaggPolicy run, the others keeping BatchedTokens: a decode
	// node's step, and so its TPOT, grows with the prefill chunk it runs beside its decodes
	// (route.decode_local_prefill), so a decode engine is given a budget sized to the TPOT
	// target, as a vLLM decode server is given its --max-num-batched-tokens.
	DecodeBatchedTokens int
	// Logger receives the nodes' logs (nil = discard).
	Logger *slog.Logger
}

// DefaultConfig returns a 4-node benchmark of the bursty mix in real time, 60 s per run.
func DefaultConfig() Config {
	return Config{
		Nodes:   4,
		Engines: testnet.EnginesEmbedded,
		// Real time: a faster run divides the SLOs by the time scale while this machine's own
		// latencies (every token is an SSE event through a node, QUIC and the load generator,
		// on shared cores) stay as they are, so past a few hundred requests a second they, not
		// the simulated GPUs, decide who meets a sub-second SLO.
		TimeScale:          1,
		Workload:           "bursty",
		Speedup:            1,
		Scale:              1,
		TraceBatchFraction: 0.3,
		Loads:              []float64{0.5, 1.0, 1.5},
		Policies:           DefaultPolicies(),
		// Past saturation a queue without admission grows for as long as the overload lasts: a
		// window of a few seconds measures how much backlog fits under the SLO, not what the
		// mesh sustains. A minute of bursty overload is what an operator has to ride out.
		Duration:     time.Minute,
		Warmup:       DefaultWarmup,
		SharedPrefix: loadgen.DefaultSharedPrefix(),
		Seed:         1,
		// 131,072 tokens: one repository prompt of the mixed workloads (about 100k tokens) fits,
		// two do not; the simulated H100's derived pool is over three times larger.
		KVBlocks:           8192,
		Interactive:        loadgen.DefaultInteractive,
		Batch:              loadgen.DefaultBatch,
		ProbeAttainment:    0.9,
		ProbeSteps:         3,
		BaselineScheduling: sim.SchedulingPriority,
		LinkGBps:           sim.DefaultConfig().LinkGBps,
	}
}

// DefaultWarmup is DefaultConfig's Warmup: long enough for the admission's drain-rate window
// and for the shared prefixes of a few hundred requests to be cached.
const DefaultWarmup = 10 * time.Second

// DefaultProbeDuration is the arrival window of a probe step when ProbeDuration is zero (or
// Duration, if shorter): below the knee no backlog builds, so a step needs less than a run.
const DefaultProbeDuration = 20 * time.Second

// validate checks cfg and fills zero fields from DefaultConfig.
func (cfg Config) validate() (Config, error) {
	def := DefaultConfig()
	bad := func(format string, a ...any) (Config, error) {
		return cfg, fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, a...))
	}
	if cfg.Nodes < 0 || cfg.TimeScale < 0 || cfg.Duration < 0 || cfg.Warmup < 0 || cfg.KVBlocks < 0 || cfg.Speedup < 0 ||
		cfg.Scale < 0 || cfg.Scale > 1 || cfg.ProbeDuration < 0 || cfg.ProbeRate < 0 || cfg.Capacity < 0 || cfg.ProbeSteps < 0 ||
		cfg.ProbeAttainment < 0 || cfg.ProbeAttainment >= 1 {
		return bad("nodes, time scale, duration, warm-up, kv blocks, speedup, probe settings must be ≥ 0, scale in (0, 1] and probe attainment below 1")
	}
	if math.IsNaN(cfg.TimeScale) || math.IsInf(cfg.TimeScale, 0) {
		return bad("time scale %v", cfg.TimeScale)
	}
	if cfg.TraceBatchFraction < 0 || cfg.TraceBatchFraction > 1 {
		return bad("trace batch fraction %v outside [0, 1]", cfg.TraceBatchFraction)
	}
	if !(cfg.LinkGBps >= 0) || math.IsInf(cfg.LinkGBps, 0) {
		return bad("link bandwidth %v GB/s", cfg.LinkGBps)
	}
	if cfg.DecodeBatchedTokens < 0 || cfg.BatchedTokens < 0 {
		return bad("step budget of %d or %d tokens < 0", cfg.BatchedTokens, cfg.DecodeBatchedTokens)
	}
	if cfg.LinkGBps == 0 {
		cfg.LinkGBps = def.LinkGBps
	}
	if roles := cfg.Disaggregated; len(roles) > 0 {
		if !slices.Contains(roles, route.RolePrefill) || !slices.Contains(roles, route.RoleDecode) {
			return bad("disaggregated roles %v name no prefill or no decode node", roles)
		}
		if cfg.Nodes != 0 && cfg.Nodes != len(roles) {
			return bad("%d nodes, but %d disaggregated roles: the two meshes have the same GPU count", cfg.Nodes, len(roles))
		}
		cfg.Nodes = len(roles)
		if len(cfg.Policies) == 0 {
			cfg.Policies = DisaggregatedPolicies(roles)
		} else if !slices.ContainsFunc(cfg.Policies, func(p Policy) bool { return len(p.Roles) > 0 }) {
			cfg.Policies = append(slices.Clone(cfg.Policies), DisaggregatedPolicies(roles)[1])
		}
	}
	if cfg.Nodes == 0 {
		cfg.Nodes = def.Nodes
	}
	switch cfg.Engines {
	case "":
		cfg.Engines = def.Engines
	case testnet.EnginesEmbedded, testnet.EnginesExternal:
	default:
		return bad("engines %q is neither %s nor %s", cfg.Engines, testnet.EnginesEmbedded, testnet.EnginesExternal)
	}
	if cfg.TimeScale == 0 {
		cfg.TimeScale = def.TimeScale
	}
	if cfg.Models < 0 || cfg.Models > cfg.Nodes {
		return bad("models %d must be in [0, nodes %d]", cfg.Models, cfg.Nodes)
	}
	if cfg.Models > 1 && len(cfg.Disaggregated) > 0 {
		return bad("models and disaggregated roles do not combine")
	}
	if cfg.Models > 1 && len(cfg.Policies) == 0 {
		cfg.Policies = MultiModelPolicies()
	}
	if cfg.Workload == loadgen.WorkloadAdapters && cfg.Trace == "" && len(cfg.Policies) == 0 {
		cfg.Policies = AdapterPolicies()
	}
	if cfg.MaxLoRAs < 0 {
		return bad("max loras %d < 0", cfg.MaxLoRAs)
	}
	if cfg.Workload == "" && cfg.Trace == "" {
		cfg.Workload = def.Workload
	}
	if cfg.Trace == "" && !slices.Contains(loadgen.Workloads(), cfg.Workload) {
		return bad("unknown workload %q (have %s)", cfg.Workload, strings.Join(loadgen.Workloads(), ", "))
	}
	if cfg.Speedup == 0 {
		cfg.Speedup = 1
	}
	if cfg.Scale == 0 {
		cfg.Scale = 1
	}
	if len(cfg.Loads) == 0 {
		cfg.Loads = def.Loads
	}
	for _, l := range cfg.Loads {
		if !(l > 0) || math.IsInf(l, 0) {
			return bad("load %v must be a positive multiple of capacity", l)
		}
	}
	if len(cfg.Policies) == 0 {
		cfg.Policies = def.Policies
	}
	if cfg.BaselineScheduling == "" {
		cfg.BaselineScheduling = def.BaselineScheduling
	}
	if !slices.Contains(sim.SchedulingPolicies, cfg.BaselineScheduling) {
		return bad("baseline scheduling %q is not one of %s", cfg.BaselineScheduling, strings.Join(sim.SchedulingPolicies, ", "))
	}
	cfg.Policies = slices.Clone(cfg.Policies) // the caller's slice is not written
	seen := map[string]bool{}
	for i := range cfg.Policies {
		p := &cfg.Policies[i]
		if p.Name == "" || seen[p.Name] {
			return bad("policy name %q empty or repeated", p.Name)
		}
		seen[p.Name] = true
		if !slices.Contains(route.PolicyNames, p.Route) {
			return bad("policy %s: route %q is not one of %s", p.Name, p.Route, strings.Join(route.PolicyNames, ", "))
		}
		switch p.Admission {
		case node.AdmissionKvmesh, node.AdmissionNone, node.AdmissionQueueCap:
		default:
			return bad("policy %s: admission %q", p.Name, p.Admission)
		}
		if p.QueueCap < 0 {
			return bad("policy %s: queue cap %d < 0", p.Name, p.QueueCap)
		}
		if len(p.Roles) > cfg.Nodes {
			return bad("policy %s: %d roles for %d nodes", p.Name, len(p.Roles), cfg.Nodes)
		}
		for _, r := range p.Roles {
			if !route.IsMixed(r) && !route.IsHalf(r) {
				return bad("policy %s: role %q is not mixed, prefill or decode", p.Name, r)
			}
			if route.IsHalf(r) && cfg.Engines != testnet.EnginesEmbedded {
				return bad("policy %s: prefill and decode nodes need embedded engines", p.Name)
			}
		}
		switch {
		case p.EngineScheduling != "":
			if !slices.Contains(sim.SchedulingPolicies, p.EngineScheduling) {
				return bad("policy %s: engine scheduling %q is not one of %s", p.Name, p.EngineScheduling, strings.Join(sim.SchedulingPolicies, ", "))
			}
		case p.Admission == node.AdmissionKvmesh: // kvmesh, and kvmesh on disaggregated roles
			p.EngineScheduling = sim.SchedulingPriority
		default:
			p.EngineScheduling = cfg.BaselineScheduling
		}
	}
	if cfg.Duration == 0 {
		cfg.Duration = def.Duration
	}
	if cfg.KVBlocks == 0 {
		cfg.KVBlocks = def.KVBlocks
	}
	if cfg.Interactive.Name == "" {
		cfg.Interactive = def.Interactive
	}
	if cfg.Batch.Name == "" {
		cfg.Batch = def.Batch
	}
	for _, c := range []loadgen.Class{cfg.Interactive, cfg.Batch} {
		if c.TTFT <= 0 || c.TPOT <= 0 {
			return bad("class %s: TTFT SLO %s and TPOT SLO %s must be > 0", c.Name, c.TTFT, c.TPOT)
		}
	}
	if cfg.Interactive.Name == cfg.Batch.Name {
		return bad("interactive and batch classes share the name %q", cfg.Batch.Name)
	}
	if cfg.ProbeDuration == 0 {
		cfg.ProbeDuration = min(DefaultProbeDuration, cfg.Duration)
	}
	if cfg.ProbeRate == 0 {
		cfg.ProbeRate = 2.5 * float64(cfg.Nodes)
	}
	if cfg.ProbeAttainment == 0 {
		cfg.ProbeAttainment = 0.9
	}
	if cfg.ProbeSteps == 0 {
		cfg.ProbeSteps = 3
	}
	return cfg, nil
}
