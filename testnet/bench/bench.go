package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/node"
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

// ClientTimeout is how long, in simulated time, the load generator's clients wait for a whole
// answer before they give up, as common client timeouts do (and as long as kvmesh's default
// queue TTL). It bounds a run's drain: a policy that lets its queues grow without bound is
// charged with timeouts rather than with a benchmark that never ends.
const ClientTimeout = time.Minute

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
		var paths *pathCounter
		keeper := &recordKeeper{}
		lc.Observe = keeper.observe
		if dis != nil {
			pools, paths = newPoolCounter(p.Roles, b.cfg.Nodes, b.cfg.TimeScale), newPathCounter(p.Roles, b.cfg.TimeScale)
			lc.Observe = func(r loadgen.RequestRecord) { keeper.observe(r); pools.observe(r); paths.observe(r) }
		}
		loadsBefore, err := adapterLoads(b.engineRegs)
		if err != nil {
			return rows, err
		}
		rep, err := loadgen.Run(ctx, lc)
		if rep != nil {
			row := newRow(p.Name, l, rep, keeper.records(), b.cfg.TimeScale, b.cfg.Interactive.Name)
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
				row.Paths = paths.latencies([]string{b.cfg.Interactive.Name, b.cfg.Batch.Name})
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
