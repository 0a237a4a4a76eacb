package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kvmesh/kvmesh/testnet/bench"
	"github.com/kvmesh/kvmesh/testnet/loadgen"
)

func benchFlags() []cli.Flag {
	d := bench.DefaultConfig()
	loads := make([]string, len(d.Loads))
	for i, l := range d.Loads {
		loads[i] = strconv.FormatFloat(l, 'g', -1, 64)
	}
	flags := []cli.Flag{
		&cli.IntFlag{Name: "nodes", Value: d.Nodes, Usage: "nodes in every run's testnet", EnvVars: env("bench-nodes")},
		&cli.IntFlag{Name: "models", Usage: "serve this many models, node i model i mod N, and send each conversation's requests for one of them through every node: each row then compares requests entering through their model's nodes and through other models' (delegated routing); --policies defaults to kvmesh,kvmesh-no-delegate", EnvVars: env("bench-models")},
		&cli.StringFlag{Name: "engines", Value: d.Engines, Usage: "embedded (the simulated engine in each node) or external (each node in front of its own kvmesh engine over HTTP)", EnvVars: env("bench-engines")},
		&cli.Float64Flag{Name: "time-scale", Value: d.TimeScale, Usage: "run the simulated engines this many times faster than real time (SLOs scale with it)", EnvVars: env("bench-time-scale")},
		&cli.StringFlag{Name: "workload", Value: d.Workload, Usage: fmt.Sprintf("synthetic workload: %v", loadgen.Workloads()), EnvVars: env("bench-workload")},
		&cli.StringFlag{Name: "trace", Usage: "replay a trace instead of a workload: Mooncake JSONL, Azure LLM inference CSV or BurstGPT CSV (make trace downloads the Mooncake conversation trace to " + defaultTrace + ")", EnvVars: env("bench-trace")},
		&cli.Float64Flag{Name: "speedup", Value: d.Speedup, Usage: "trace time compression (the bench re-paces the trace to each load)", EnvVars: env("bench-speedup")},
		&cli.Float64Flag{Name: "scale", Value: d.Scale, Usage: "trace token-length scale, in (0, 1]", EnvVars: env("bench-scale")},
		&cli.Float64Flag{Name: "batch-fraction", Value: d.TraceBatchFraction, Usage: "fraction of trace requests sent as the sheddable batch class", EnvVars: env("bench-batch-fraction")},
		&cli.StringFlag{Name: "loads", Value: strings.Join(loads, ","), Usage: "offered loads, comma-separated multiples of the measured capacity", EnvVars: env("bench-loads")},
		&cli.StringFlag{Name: "policies", Value: strings.Join(bench.PolicyNames(), ","), Usage: "policies to compare, comma-separated", EnvVars: env("bench-policies")},
		&cli.DurationFlag{Name: "duration", Value: d.Duration, Usage: "arrival window of each run (wall time)", EnvVars: env("bench-duration")},
		&cli.DurationFlag{Name: "warmup", Value: d.Warmup, Usage: "arrival window (wall time) of an unmeasured run before each measured one, at its load, of other requests over the workload's shared texts (0: none; a trace is not warmed up)", EnvVars: env("bench-warmup")},
		&cli.DurationFlag{Name: "probe-duration", Usage: "arrival window of each capacity probe step (wall time; default 20s, or --duration if shorter)", EnvVars: env("bench-probe-duration")},
		&cli.Float64Flag{Name: "capacity", Usage: "skip the probe and take this capacity (requests per simulated second)", EnvVars: env("bench-capacity")},
		&cli.Float64Flag{Name: "probe-attainment", Value: d.ProbeAttainment, Usage: "capacity is the highest rate at which cache-aware routing without admission meets this share of SLOs", EnvVars: env("bench-probe-attainment")},
		&cli.Int64Flag{Name: "seed", Value: d.Seed, Usage: "workload seed", EnvVars: env("bench-seed")},
		&cli.BoolFlag{Name: "fitted-ttft", Usage: "send no TTFT SLO header: the mesh fits each request's target to its size and declares it, which judges the request", EnvVars: env("bench-fitted-ttft")},
		&cli.DurationFlag{Name: "ttft-slo", Value: d.Interactive.TTFT, Usage: "interactive class TTFT SLO (simulated time)", EnvVars: env("bench-ttft-slo")},
		&cli.DurationFlag{Name: "tpot-slo", Value: d.Interactive.TPOT, Usage: "interactive class TPOT SLO (simulated time): the target each interactive request carries, which routing's split rule and admission act on", EnvVars: env("bench-tpot-slo")},
		&cli.IntFlag{Name: "kv-blocks", Value: d.KVBlocks, Usage: "KV cache blocks per simulated engine", EnvVars: env("bench-kv-blocks")},
		&cli.StringFlag{Name: "baseline-scheduling", Value: d.BaselineScheduling, Usage: "scheduling policy of the engines of every policy but kvmesh (whose engines schedule by priority) and of the capacity probe: priority or fcfs (vLLM's and SGLang's default)", EnvVars: env("bench-baseline-scheduling")},
		&cli.StringFlag{Name: "disaggregated", Usage: "node roles, comma-separated (mixed, prefill or decode), e.g. prefill,prefill,decode,decode: run kvmesh on a testnet of those roles (kvmesh-disagg) beside kvmesh on as many mixed nodes; --nodes is their count, and other policies run only if --policies names them", EnvVars: env("bench-disaggregated")},
		&cli.Float64Flag{Name: "disagg-link-gbps", Value: d.LinkGBps, Usage: "bandwidth, in GB/s, of the link a split request's KV crosses (the simulated engines' and the split rule's)", EnvVars: env("bench-disagg-link-gbps")},
		&cli.StringFlag{Name: "json", Usage: "write the result as JSON to this file", EnvVars: env("bench-json")},
		&cli.StringFlag{Name: "plot", Usage: "write an SVG plot of goodput and each class's p99 TTFT per policy to this file", EnvVars: env("bench-plot")},
		&cli.StringFlag{Name: "html", Usage: "write the comparison as one self-contained HTML page (plots and tables, no script, nothing fetched) to this file", EnvVars: env("bench-html")},
		&cli.IntFlag{Name: "batched-tokens", Usage: "step token budget of every simulated engine (0: the engine's, --sim-max-batched-tokens); --disagg-decode-batched-tokens overrides it on decode nodes", EnvVars: env("bench-batched-tokens")},
		&cli.IntFlag{Name: "disagg-decode-batched-tokens", Usage: "step token budget of the decode nodes' engines (0: the engine's, --sim-max-batched-tokens): the prefill chunk a decode node runs beside its decodes, and so its TPOT", EnvVars: env("bench-disagg-decode-batched-tokens")},
		&cli.StringFlag{Name: "pool-plot", Usage: "with --disaggregated, write an SVG plot of the requests each pool accepted and refused per second to this file", EnvVars: env("bench-pool-plot")},
		&cli.StringFlag{Name: "requests", Usage: "write one line of JSON per request of every measured run (its \"run\" POLICY@LOAD) to this file", EnvVars: env("bench-requests")},
		&cli.StringFlag{Name: "cpu-profile", Usage: "write a Go CPU profile of the whole run to this file (the bench's own cost on a shared machine)", EnvVars: env("bench-cpu-profile")},
		&cli.BoolFlag{Name: "quiet", Usage: "no progress lines", EnvVars: env("bench-quiet")},
	}
	flags = append(flags, &cli.IntFlag{Name: "max-loras", Usage: "adapters workload: every engine's GPU adapter slots (0: the engine's default, 4)", EnvVars: env("bench-max-loras")})
	return append(flags, sharedPrefixFlags("bench")...)
}

func parseLoads(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || !(v > 0) {
			return nil, fmt.Errorf("bench: --loads: %q is not a positive number", f)
		}
		out = append(out, v)
	}
	return out, nil
}

func parsePolicies(s string) ([]bench.Policy, error) {
	var out []bench.Policy
	for _, name := range strings.Split(s, ",") {
		if name = strings.TrimSpace(name); name == "" {
			continue
		}
		p, ok := bench.PolicyByName(name)
		if !ok {
			return nil, fmt.Errorf("bench: --policies: unknown policy %q (have %s, %s, %s)", name, strings.Join(bench.PolicyNames(), ", "), bench.NoDelegatePolicy, bench.LoRAAffinityPolicy.Name)
		}
		out = append(out, p)
	}
	return out, nil
}

// defaultTrace is where `make trace` puts the Mooncake conversation trace (the Makefile's TRACE).
const defaultTrace = "traces/mooncake_conversation_trace.jsonl"

// checkTrace refuses a --trace file that does not exist with what to do instead: a clone has
// no trace until `make trace` downloads one, and without --trace a synthetic workload runs.
func checkTrace(cmd, path string) error {
	if path == "" {
		return nil
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: --trace %s: no such file; `make trace` downloads the Mooncake conversation trace to %s, "+
			"or leave --trace out to run the synthetic --workload", cmd, path, defaultTrace)
	}
	return nil
}

func benchConfig(c *cli.Context) (bench.Config, error) {
	cfg := bench.DefaultConfig()
	if err := checkTrace("bench", c.String("trace")); err != nil {
		return cfg, err
	}
	var err error
	if cfg.Loads, err = parseLoads(c.String("loads")); err != nil {
		return cfg, err
	}
	if cfg.Policies, err = parsePolicies(c.String("policies")); err != nil {
		return cfg, err
	}
	cfg.Nodes = c.Int("nodes")
	cfg.Models = c.Int("models")
	if cfg.Models > 1 && !c.IsSet("policies") {
		cfg.Policies = nil // the multi-model policies
	}
	cfg.Engines = c.String("engines")
	cfg.TimeScale = c.Float64("time-scale")
	cfg.Workload = c.String("workload")
	if cfg.Workload == loadgen.WorkloadAdapters && !c.IsSet("policies") {
		cfg.Policies = nil // lora-affinity and kvmesh
	}
	cfg.MaxLoRAs = c.Int("max-loras")
	cfg.Trace = c.String("trace")
	cfg.Speedup = c.Float64("speedup")
	cfg.Scale = c.Float64("scale")
	cfg.TraceBatchFraction = c.Float64("batch-fraction")
	cfg.Duration = c.Duration("duration")
	cfg.Warmup = c.Duration("warmup")
	cfg.SharedPrefix = sharedPrefixConfig(c)
	cfg.ProbeDuration = c.Duration("probe-duration")
	cfg.ProbeAttainment = c.Float64("probe-attainment")
	cfg.Capacity = c.Float64("capacity")
	cfg.Seed = c.Int64("seed")
	cfg.KVBlocks = c.Int("kv-blocks")
	cfg.BaselineScheduling = c.String("baseline-scheduling")
	cfg.FittedTTFT = c.Bool("fitted-ttft")
	cfg.Interactive.TTFT = c.Duration("ttft-slo")
	cfg.Interactive.TPOT = c.Duration("tpot-slo")
	cfg.LinkGBps = c.Float64("disagg-link-gbps")
	cfg.DecodeBatchedTokens = c.Int("disagg-decode-batched-tokens")
	cfg.BatchedTokens = c.Int("batched-tokens")
	if s := c.String("disaggregated"); s != "" {
		for _, r := range strings.Split(s, ",") {
			cfg.Disaggregated = append(cfg.Disaggregated, strings.TrimSpace(r))
		}
		// The mixed mesh takes the roles' node count, and only kvmesh runs beside
		// kvmesh-disagg unless asked for more.
		if !c.IsSet("nodes") {
			cfg.Nodes = 0
		}
		if !c.IsSet("policies") {
			cfg.Policies = nil
		}
	}
	if !c.Bool("quiet") {
		cfg.Progress = os.Stderr
	}
	// Node logs would bury the table; only warnings and errors are kept.
	log, err := newLogger(c)
	if err != nil {
		return cfg, err
	}
	if !log.Enabled(c.Context, slog.LevelDebug) {
		log = slog.New(&minLevel{log.Handler(), slog.LevelWarn})
	}
	cfg.Logger = log
	return cfg, nil
}

// minLevel drops records below level.
type minLevel struct {
	slog.Handler
	level slog.Level
}

func (h *minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.level && h.Handler.Enabled(ctx, l)
}

func (h *minLevel) WithAttrs(as []slog.Attr) slog.Handler {
	return &minLevel{h.Handler.WithAttrs(as), h.level}
}

func (h *minLevel) WithGroup(name string) slog.Handler {
	return &minLevel{h.Handler.WithGroup(name), h.level}
}

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "measure a testnet's capacity, then compare goodput of routing and admission policies at multiples of it",
		Flags: benchFlags(),
		Action: func(c *cli.Context) error {
			cfg, err := benchConfig(c)
			if err != nil {
				return err
			}
			if os.Getenv("GOGC") == "" {
				// Every node and the load generator share this process, and the collector's
				// share of the cores is taken from them: memory is the cheaper resource here.
				debug.SetGCPercent(benchGCPercent)
			}
			if path := c.String("cpu-profile"); path != "" {
				stop, err := startCPUProfile(path)
				if err != nil {
					return err
				}
				defer stop()
			}
			closeRecords, err := openRecords(c.String("requests"), &cfg.Requests)
			if err != nil {
				return err
			}
			start := time.Now()
			res, err := bench.Run(c.Context, cfg)
			err = errors.Join(err, closeRecords())
			if res == nil {
				return err
			}
			if werr := writeBench(res, os.Stdout, benchOutputs{c.String("json"), c.String("plot"), c.String("pool-plot"), c.String("html")}); werr != nil {
				return werr
			}
			fmt.Fprintf(os.Stderr, "bench: finished in %s\n", time.Since(start).Round(time.Second))
			return err
		},
	}
}

// benchGCPercent is kvmesh bench's GC target unless GOGC is set. At the default (100) the
// collector took about a sixth of a bench's CPU profile; four times the heap growth costs a
// few hundred MiB.
const benchGCPercent = 400

// startCPUProfile profiles the process into path until the returned stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("bench: --cpu-profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("bench: --cpu-profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// benchOutputs are the files a bench writes besides its table; an empty path writes none.
type benchOutputs struct{ json, plot, poolPlot, html string }

// writeBench prints res's table and writes the optional JSON, SVG and HTML files.
func writeBench(res *bench.Result, out io.Writer, o benchOutputs) error {
	if err := res.WriteTable(out); err != nil {
		return err
	}
	for _, f := range []struct {
		path  string
		write func(io.Writer) error
	}{{o.json, res.WriteJSON}, {o.plot, res.WriteSVG}, {o.poolPlot, res.WritePoolSVG}, {o.html, res.WriteHTML}} {
		if f.path == "" {
			continue
		}
		fh, err := os.Create(f.path)
		if err != nil {
			return err
		}
		if err := f.write(fh); err != nil {
			fh.Close()
			return err
		}
		if err := fh.Close(); err != nil {
			return err
		}
	}
	return nil
}
