package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/engine/sim"
	"github.com/kvmesh/kvmesh/testnet"
	"github.com/kvmesh/kvmesh/testnet/loadgen"
)

// Sentinel errors; returned errors wrap them.
var (
	// ErrConfig reports an invalid Config.
	ErrConfig = errors.New("bench: invalid config")
	// ErrProbe reports a capacity probe that measured nothing usable.
	ErrProbe = errors.New("bench: capacity probe failed")
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

// ClientTimeout is how long, in simulated time, the load generator's clients wait for a whole
// answer before they give up, as common client timeouts do (and as long as kvmesh's default
// queue TTL). It bounds a run's drain: a policy that lets its queues grow without bound is
// charged with timeouts rather than with a benchmark that never ends.
const ClientTimeout = time.Minute

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
	// the wire).
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

// maxProbeDoublings bounds the probe's search for a rate the baseline cannot serve.
const maxProbeDoublings = 8

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

// Run measures capacity, then runs every policy at every load (see the package doc). When ctx
// ends or a run fails, it returns what it has measured so far with the error.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	res := &Result{
		Nodes: cfg.Nodes, Models: cfg.Models, Engines: cfg.Engines, TimeScale: cfg.TimeScale, Workload: cfg.Workload, Trace: cfg.Trace,
		Speedup: cfg.Speedup, Scale: cfg.Scale, Seed: cfg.Seed, Duration: cfg.Duration.Seconds(),
		KVBlocks: cfg.KVBlocks, Loads: slices.Clone(cfg.Loads), Policies: slices.Clone(cfg.Policies),
		Interactive: cfg.Interactive.Name, BaselineScheduling: cfg.BaselineScheduling,
		Disaggregated: slices.Clone(cfg.Disaggregated), LinkGBps: cfg.LinkGBps, DecodeBatchedTokens: cfg.DecodeBatchedTokens,
		BatchedTokens: cfg.BatchedTokens,
	}
	if cfg.Trace != "" {
		res.Workload = "trace"
	} else {
		res.Warmup = cfg.Warmup.Seconds()
	}
	if res.Workload == "shared-prefix" || res.Workload == loadgen.WorkloadAdapters {
		sp := cfg.SharedPrefix
		res.SharedPrefix = &sp
	}
	b := &bencher{cfg: cfg}
	if cfg.Trace != "" {
		if b.traceRate, err = traceRate(cfg); err != nil {
			return nil, err
		}
	}
	if cfg.Capacity > 0 {
		res.Capacity = cfg.Capacity
	} else {
		if res.Probe, err = b.probe(ctx); err != nil {
			return res, err
		}
		res.Capacity = res.Probe.Capacity
	}
	if b.oracle, err = b.oracleHitRatios(res.Capacity * cfg.TimeScale); err != nil {
		return res, err
	}
	for _, p := range cfg.Policies {
		rows, err := b.policy(ctx, p, res.Capacity*cfg.TimeScale)
		res.Rows = append(res.Rows, rows...)
		if err != nil {
			res.Ratios = Ratios(res.Rows)
			return res, err
		}
	}
	res.Ratios = Ratios(res.Rows)
	return res, nil
}

// bencher is one Run in progress.
type bencher struct {
	cfg Config
	// traceRate is the trace's mean wall rate at Speedup and multiplier 1 (req/s).
	traceRate float64
	// oracle is the pooled-LRU oracle's hit ratio per load (nil: none).
	oracle []float64
	// engineRegs hold the running testnet's engines' metrics, node by node, in the adapters
	// workload (nil otherwise).
	engineRegs []*prometheus.Registry
}

func (b *bencher) progressf(format string, a ...any) {
	if b.cfg.Progress != nil {
		fmt.Fprintf(b.cfg.Progress, "bench: "+format+"\n", a...)
	}
}

// start starts a fresh testnet with p on every node and waits for it to converge.
func (b *bencher) start(ctx context.Context, p Policy) (*testnet.Net, error) {
	b.engineRegs = nil
	if b.adapters() {
		for range b.cfg.Nodes {
			b.engineRegs = append(b.engineRegs, prometheus.NewRegistry())
		}
	}
	tc := testnet.Config{
		Nodes:   b.cfg.Nodes,
		Engines: b.cfg.Engines,
		Roles:   p.Roles,
		Fast:    true, // gossip's timers on the same footing as the sped-up engines
		Logger:  b.cfg.Logger,
		Configure: func(i int, nc *node.Config) {
			nc.Policy, nc.Admission = p.Route, p.Admission
			if p.QueueCap > 0 {
				nc.QueueCap = p.QueueCap
			}
			if p.NoDelegate {
				nc.Route.Delegate = new(bool)
			}
			if b.cfg.Models > 1 {
				nc.Models = []string{ModelName(i % b.cfg.Models)}
			}
			// The failure detector keeps LAN-like patience: a process saturated by a burst
			// answers a probe late, and a peer wrongly suspected loses its prefixes for every
			// policy alike. State and prefixes still spread at the fast timers.
			nc.Gossip.ProbeInterval, nc.Gossip.ProbeTimeout, nc.Gossip.SuspicionMult = 500*time.Millisecond, 250*time.Millisecond, 4
			nc.Sim.TimeScale = b.cfg.TimeScale
			nc.Sim.KVBlocks = b.cfg.KVBlocks
			nc.Sim.LinkGBps = b.cfg.LinkGBps
			if b.cfg.BatchedTokens > 0 {
				nc.Sim.MaxNumBatchedTokens = b.cfg.BatchedTokens
			}
			if nc.Role == route.RoleDecode && b.cfg.DecodeBatchedTokens > 0 {
				nc.Sim.MaxNumBatchedTokens = b.cfg.DecodeBatchedTokens
			}
			nc.Sim.SchedulingPolicy = p.EngineScheduling // an external engine takes it too
			scaleAdmission(&nc.Admit, b.cfg.TimeScale)
			if b.adapters() {
				b.configureAdapters(nc, b.engineRegs[i])
			}
			if b.cfg.Configure != nil {
				b.cfg.Configure(i, nc)
			}
		},
	}
	tn, err := testnet.Start(ctx, tc)
	if err != nil {
		return nil, fmt.Errorf("bench: %s: %w", p.Name, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := tn.WaitConverged(wctx); err != nil {
		return nil, errors.Join(fmt.Errorf("bench: %s: %w", p.Name, err), tn.Close())
	}
	return tn, nil
}

// load returns the loadgen config of a run against urls at wallRate requests per second.
func (b *bencher) load(urls []string, wallRate float64, window time.Duration) loadgen.Config {
	s := b.cfg.TimeScale
	lc := loadgen.DefaultConfig()
	lc.Targets = urls
	lc.Model = node.DefaultModel
	lc.Models = modelTargets(urls, b.cfg.Models)
	lc.Workload, lc.Trace = b.cfg.Workload, b.cfg.Trace
	lc.Speedup, lc.Scale, lc.TraceBatchFraction = b.cfg.Speedup, b.cfg.Scale, b.cfg.TraceBatchFraction
	lc.SharedPrefix = b.cfg.SharedPrefix
	lc.Seed = b.cfg.Seed
	lc.Duration = window
	lc.Rate = wallRate
	if b.cfg.Trace != "" {
		lc.Rate = wallRate / b.traceRate // loadgen's trace rate is a multiplier of the trace's own
	}
	lc.Interactive, lc.Batch = scaleClass(b.cfg.Interactive, s), scaleClass(b.cfg.Batch, s)
	lc.ToolWait = scaleDur(lc.ToolWait, s)
	lc.BurstPeriod = scaleDur(loadgen.DefaultBurstPeriod, s)
	lc.Timeout = scaleDur(ClientTimeout, s)
	lc.Progress = b.cfg.Progress
	lc.FittedTTFT = b.cfg.FittedTTFT
	return lc
}

// scaleAdmission divides admission's durations that stand for the hardware's time (the queue's
// TTL and target TTFT, the drain-rate window, the class SLO defaults) by s, so that kvmesh's
// admission sees the same situation as at TimeScale 1. Retry-After's clamps are left alone: the
// header carries whole seconds and the bench does not retry.
func scaleAdmission(a *admit.Config, s float64) {
	sc := func(d *admit.Duration) { *d = admit.Duration(scaleDur(time.Duration(*d), s)) }
	sc(&a.Queue.TTL)
	sc(&a.Queue.TargetTTFT)
	sc(&a.Queue.DrainWindow)
	a.Queue.DrainWindow = max(a.Queue.DrainWindow, admit.Duration(time.Second)) // admit's floor
	for _, c := range []*admit.ClassSLO{&a.SLO.High, &a.SLO.Normal, &a.SLO.Low} {
		sc(&c.TTFT)
		sc(&c.TPOT)
	}
}

func scaleDur(d time.Duration, s float64) time.Duration { return time.Duration(float64(d) / s) }

func scaleClass(c loadgen.Class, s float64) loadgen.Class {
	c.TTFT, c.TPOT = scaleDur(c.TTFT, s), scaleDur(c.TPOT, s)
	return c
}

// traceRate is the trace's mean rate, in wall requests per second, at cfg's Speedup and Scale
// and multiplier 1, over the whole trace.
func traceRate(cfg Config) (float64, error) {
	lc := loadgen.DefaultConfig()
	lc.Targets = []string{"http://127.0.0.1"} // Plan validates a target it never contacts
	lc.Trace, lc.Speedup, lc.Scale, lc.Duration, lc.Rate = cfg.Trace, cfg.Speedup, cfg.Scale, 0, 1
	items, err := loadgen.Plan(lc)
	if err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	if len(items) < 2 || items[len(items)-1].At <= 0 {
		return 0, fmt.Errorf("%w: trace %s has no time span to take a rate from", ErrConfig, cfg.Trace)
	}
	return float64(len(items)) / items[len(items)-1].At.Seconds(), nil
}

// ProbePolicy is the baseline whose SLO knee defines capacity: cache-aware routing without
// admission, what a fleet would run without kvmesh. Its engines schedule as
// Config.BaselineScheduling says.
var ProbePolicy = Policy{Name: "probe", Route: route.PolicyCacheAware, Admission: node.AdmissionNone}

// probePolicy is ProbePolicy on engines scheduled as the baselines' are.
func (b *bencher) probePolicy() Policy {
	p := ProbePolicy
	if b.adapters() {
		p.Route = route.PolicyLoRAAffinity // cache-aware routing knows no adapters
	}
	p.EngineScheduling = b.cfg.BaselineScheduling
	return p
}

// probe measures the mesh's capacity (see the package doc) on its own testnet: the highest
// offered rate at which ProbePolicy still meets ProbeAttainment, found by doubling the rate
// until a step misses it and then bisecting.
func (b *bencher) probe(ctx context.Context) (*Probe, error) {
	pp := b.probePolicy()
	tn, err := b.start(ctx, pp)
	if err != nil {
		return nil, err
	}
	defer tn.Close()
	pr := &Probe{Policy: pp.Route, EngineScheduling: pp.EngineScheduling, Attainment: b.cfg.ProbeAttainment}
	step := func(rate float64) (bool, error) {
		s := b.cfg.TimeScale
		b.progressf("capacity probe: %.2f req/s (simulated) for %s", rate, b.cfg.ProbeDuration)
		// A request with no answer a batch TTFT SLO after the window has missed its SLO
		// whatever its class: the step is cut there, and what it cut counts as missed.
		sctx, cancel := context.WithTimeout(ctx, b.cfg.ProbeDuration+scaleDur(b.cfg.Batch.TTFT, s))
		rep, err := loadgen.Run(sctx, b.load(tn.URLs(), rate*s, b.cfg.ProbeDuration))
		cancel()
		if ctx.Err() != nil {
			return false, fmt.Errorf("bench: probe: %w", ctx.Err())
		}
		if rep == nil {
			return false, fmt.Errorf("bench: probe: %w", err)
		}
		st := ProbeStep{OfferedRPS: rate, Sent: rep.Sent, Good: rep.Good, Attainment: rep.Attainment}
		pr.Steps = append(pr.Steps, st)
		return rep.Sent > 0 && st.Attainment >= b.cfg.ProbeAttainment, nil
	}
	lo, err := searchKnee(b.cfg.ProbeRate, b.cfg.ProbeSteps, step)
	if err != nil {
		return pr, err
	}
	pr.Capacity = lo
	b.progressf("capacity: %.2f req/s (simulated)", pr.Capacity)
	return pr, nil
}

// searchKnee returns the highest rate at which met holds, assuming it holds below some knee and
// not above: from start it doubles (or halves) the rate until one rate meets and its double
// does not, then bisects that octave geometrically steps times.
func searchKnee(start float64, steps int, met func(rate float64) (bool, error)) (float64, error) {
	lo, hi := 0.0, 0.0 // the highest rate met, the lowest missed
	for rate, n := start, 0; lo == 0 || hi == 0; n++ {
		if n >= maxProbeDoublings {
			return 0, fmt.Errorf("%w: after %d steps from %.3g req/s, no rate met the SLO target below one that missed it",
				ErrProbe, n, start)
		}
		ok, err := met(rate)
		if err != nil {
			return 0, err
		}
		if ok {
			lo, rate = rate, rate*2
		} else {
			hi, rate = rate, rate/2
		}
	}
	for range steps {
		mid := math.Sqrt(lo * hi)
		ok, err := met(mid)
		if err != nil {
			return 0, err
		}
		if ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, nil
}

// policy runs every load under p on a fresh testnet.
func (b *bencher) policy(ctx context.Context, p Policy, wallCapacity float64) (rows []Row, err error) {
	b.progressf("policy %s: starting %d nodes (route %s, admission %s, %s engine scheduling)", p.Name, b.cfg.Nodes, p.Route, p.Admission, p.EngineScheduling)
	tn, err := b.start(ctx, p)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, tn.Close()) }()
	for i, l := range b.cfg.Loads {
		if wc, ok := b.warmupLoad(tn.URLs(), i, l*wallCapacity); ok {
			b.progressf("policy %s: warm-up at %.2g× capacity for %s", p.Name, l, b.cfg.Warmup)
			if _, err := loadgen.Run(ctx, wc); err != nil {
				return rows, fmt.Errorf("bench: %s warm-up at %.2g×: %w", p.Name, l, err)
			}
		}
		b.progressf("policy %s: load %.2g× capacity (%.2f req/s simulated)", p.Name, l, l*wallCapacity/b.cfg.TimeScale)
		lc := b.load(tn.URLs(), l*wallCapacity, b.cfg.Duration)
		lc.Requests, lc.RunLabel = b.cfg.Requests, fmt.Sprintf("%s@%g", p.Name, l)
		before, err := b.residency(ctx, tn, nil)
		if err != nil {
			return rows, err
		}
		dis, err := b.disaggregated(ctx, tn, nil)
		if err != nil {
			return rows, err
		}
		del, err := b.delegated(ctx, tn, nil)
		if err != nil {
			return rows, err
		}
		var pools *poolCounter
		if dis != nil {
			pools = newPoolCounter(p.Roles, b.cfg.Nodes, b.cfg.TimeScale)
			lc.Observe = pools.observe
		}
		loadsBefore, err := adapterLoads(b.engineRegs)
		if err != nil {
			return rows, err
		}
		rep, err := loadgen.Run(ctx, lc)
		if rep != nil {
			row := newRow(p.Name, l, rep, b.cfg.TimeScale, b.cfg.Interactive.Name)
			if loads, lerr := adapterLoads(b.engineRegs); lerr == nil && b.adapters() && rep.Sent > 0 {
				per := 1000 * (loads - loadsBefore) / float64(rep.Sent)
				row.AdapterLoadsPer1k = &per
			}
			if b.oracle != nil {
				hit := b.oracle[i]
				row.OracleHitRatio = &hit
			}
			after, rerr := b.residency(ctx, tn, before)
			if rerr != nil {
				return rows, rerr
			}
			if after != nil {
				re := after.summary()
				row.Residency = &re
			}
			if row.Delegated, rerr = b.delegated(ctx, tn, del); rerr != nil {
				return rows, rerr
			}
			if dis != nil {
				if row.Disaggregated, rerr = b.disaggregated(ctx, tn, dis); rerr != nil {
					return rows, rerr
				}
				row.Split, row.Whole = splitWhole(row.Disaggregated)
				window := int(math.Ceil(b.cfg.Duration.Seconds() * b.cfg.TimeScale))
				row.Pools, row.PoolCorrelation = pools.timelines(window)
			}
			rows = append(rows, row)
		}
		if err != nil {
			return rows, fmt.Errorf("bench: %s at %.2g×: %w", p.Name, l, err)
		}
	}
	return rows, nil
}

// warmupLoad returns the loadgen config of the warm-up before the measured run of load i at
// wallRate (see Config.Warmup), and whether there is one.
func (b *bencher) warmupLoad(urls []string, i int, wallRate float64) (loadgen.Config, bool) {
	if b.cfg.Warmup <= 0 || b.cfg.Trace != "" {
		return loadgen.Config{}, false
	}
	wc := b.load(urls, wallRate, b.cfg.Warmup)
	wc.Variant = uint64(i + 1) // each load's warm-up its own requests, none of a measured run's
	wc.Progress = nil
	return wc, true
}

// disaggregated reads the testnet's dispatches by disaggregation outcome, as counted since
// before when before is not nil; nil, with nothing read, unless Config.Disaggregated is set.
func (b *bencher) disaggregated(ctx context.Context, tn *testnet.Net, before map[string]int) (map[string]int, error) {
	if len(b.cfg.Disaggregated) == 0 {
		return nil, nil
	}
	return scrapeOutcomes(ctx, tn.URLs(), disaggMetric, before)
}

// residency reads the residency model's error histograms of a testnet of external engines
// (nil for embedded engines), as gathered since before when before is not nil.
func (b *bencher) residency(ctx context.Context, tn *testnet.Net, before buckets) (buckets, error) {
	if b.cfg.Engines != testnet.EnginesExternal {
		return nil, nil
	}
	now, err := scrapeResidency(ctx, tn.URLs())
	if err != nil || before == nil {
		return now, err
	}
	return now.since(before), nil
}
