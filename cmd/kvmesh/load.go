package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet/loadgen"
)

func loadFlags() []cli.Flag {
	d := loadgen.DefaultConfig()
	flags := []cli.Flag{
		&cli.StringSliceFlag{Name: "target", Usage: "base URL of an ingress node (repeatable; requests are spread round-robin)", EnvVars: env("load-target")},
		&cli.StringFlag{Name: "model", Value: node.DefaultModel, Usage: "model name sent in each request", EnvVars: env("load-model")},
		&cli.StringFlag{Name: "workload", Value: d.Workload, Usage: fmt.Sprintf("synthetic workload: %v", loadgen.Workloads()), EnvVars: env("load-workload")},
		&cli.StringFlag{Name: "trace", Usage: "replay a trace instead of a workload: Mooncake JSONL, Azure LLM inference CSV or BurstGPT CSV", EnvVars: env("load-trace")},
		&cli.Float64Flag{Name: "rate", Value: d.Rate, Usage: "requests per second (a multiplier of the trace's own rate with --trace)", EnvVars: env("load-rate")},
		&cli.DurationFlag{Name: "duration", Value: d.Duration, Usage: "arrival window", EnvVars: env("load-duration")},
		&cli.Int64Flag{Name: "seed", Value: d.Seed, Usage: "workload seed", EnvVars: env("load-seed")},
		&cli.Float64Flag{Name: "speedup", Value: d.Speedup, Usage: "trace time compression, > 0", EnvVars: env("load-speedup")},
		&cli.Float64Flag{Name: "scale", Value: d.Scale, Usage: "trace token-length scale, in (0, 1]", EnvVars: env("load-scale")},
		&cli.IntFlag{Name: "max-requests", Usage: "cap on requests sent (0: none)", EnvVars: env("load-max-requests")},
		&cli.IntFlag{Name: "concurrency", Usage: "cap on requests in flight (0: none)", EnvVars: env("load-concurrency")},
		&cli.IntFlag{Name: "sessions", Usage: "agents workload: keep this many sessions running, the next starting as one ends (0: sessions arrive at --rate)", EnvVars: env("load-sessions")},
		&cli.IntFlag{Name: "retries", Usage: "retries of a refusal that carries Retry-After", EnvVars: env("load-retries")},
		&cli.DurationFlag{Name: "ttft-slo", Value: d.Interactive.TTFT, Usage: "interactive class TTFT SLO", EnvVars: env("load-ttft-slo")},
		&cli.DurationFlag{Name: "tpot-slo", Value: d.Interactive.TPOT, Usage: "interactive class TPOT SLO", EnvVars: env("load-tpot-slo")},
		&cli.BoolFlag{Name: "natural-lengths", Usage: "send no ignore_eos: the engine may end a reply before max_tokens (by default replies are as long as the workload says)", EnvVars: env("load-natural-lengths")},
		&cli.BoolFlag{Name: "fitted-ttft", Usage: "send no TTFT SLO header: the mesh fits each request's target to its size and declares it in X-Kvmesh-TTFT-Target, which judges the request", EnvVars: env("load-fitted-ttft")},
		&cli.StringFlag{Name: "json", Usage: "write the report as JSON to this file", EnvVars: env("load-json")},
		&cli.StringFlag{Name: "plot", Usage: "write an SVG plot of goodput and p99 TTFT to this file", EnvVars: env("load-plot")},
		&cli.StringFlag{Name: "requests", Usage: "write one line of JSON per request (outcome, node, tokens, latencies, SLO met) to this file", EnvVars: env("load-requests")},
		&cli.StringFlag{Name: "api-key", Usage: "API key sent as Authorization: Bearer KEY", EnvVars: env("load-api-key")},
		&cli.BoolFlag{Name: "quiet", Usage: "no progress line (one line per update when stderr is not a terminal)", EnvVars: env("load-quiet")},
		caCertFlag("load"),
	}
	return append(flags, sharedPrefixFlags("load")...)
}

// sharedPrefixFlags are the shared-prefix workload's flags of cmd (load or bench).
func sharedPrefixFlags(cmd string) []cli.Flag {
	d := loadgen.DefaultSharedPrefix()
	return []cli.Flag{
		&cli.IntFlag{Name: "tenants", Value: d.Tenants, Usage: "shared-prefix and adapters workloads: tenants, each with its own system prompt (adapters: each an adapter, lora-000 on)", EnvVars: env(cmd + "-tenants")},
		&cli.IntFlag{Name: "system-tokens", Value: d.SystemTokens, Usage: "shared-prefix and adapters workloads: mean tokens of a tenant's system prompt (each tenant's fixed in 0.75-1.25× it)", EnvVars: env(cmd + "-system-tokens")},
		&cli.IntFlag{Name: "question-tokens", Value: d.QuestionTokens, Usage: "shared-prefix and adapters workloads: mean tokens of a request's question (0.5-1.5× it)", EnvVars: env(cmd + "-question-tokens")},
		&cli.IntFlag{Name: "reply-tokens", Value: d.ReplyTokens, Usage: "shared-prefix and adapters workloads: mean tokens of a reply (0.75-1.25× it)", EnvVars: env(cmd + "-reply-tokens")},
		&cli.Float64Flag{Name: "tenant-zipf", Value: d.TenantZipf, Usage: "shared-prefix and adapters workloads: tenant popularity ∝ (rank+1)^-S (0: uniform)", EnvVars: env(cmd + "-tenant-zipf")},
		&cli.Float64Flag{Name: "follow-ups", Value: d.FollowUps, Usage: "shared-prefix and adapters workloads: fraction of requests that continue their tenant's latest conversation (its prompt and reply, then a new question), in [0, 1)", EnvVars: env(cmd + "-follow-ups")},
	}
}

// sharedPrefixConfig reads sharedPrefixFlags.
func sharedPrefixConfig(c *cli.Context) loadgen.SharedPrefix {
	return loadgen.SharedPrefix{
		Tenants: c.Int("tenants"), SystemTokens: c.Int("system-tokens"), QuestionTokens: c.Int("question-tokens"),
		ReplyTokens: c.Int("reply-tokens"), TenantZipf: c.Float64("tenant-zipf"), FollowUps: c.Float64("follow-ups"),
	}
}

func loadConfig(c *cli.Context) loadgen.Config {
	cfg := loadgen.DefaultConfig()
	cfg.Targets = c.StringSlice("target")
	cfg.Model = c.String("model")
	cfg.Workload = c.String("workload")
	cfg.Trace = c.String("trace")
	cfg.Rate = c.Float64("rate")
	cfg.Duration = c.Duration("duration")
	cfg.Seed = c.Int64("seed")
	cfg.Speedup = c.Float64("speedup")
	cfg.Scale = c.Float64("scale")
	cfg.MaxRequests = c.Int("max-requests")
	cfg.Concurrency = c.Int("concurrency")
	cfg.Sessions = c.Int("sessions")
	cfg.Retries = c.Int("retries")
	cfg.SharedPrefix = sharedPrefixConfig(c)
	cfg.Interactive.TTFT = c.Duration("ttft-slo")
	cfg.Interactive.TPOT = c.Duration("tpot-slo")
	cfg.FittedTTFT = c.Bool("fitted-ttft")
	cfg.NaturalLengths = c.Bool("natural-lengths")
	cfg.APIKey = c.String("api-key")
	if !c.Bool("quiet") {
		cfg.Progress = os.Stderr
	}
	return cfg
}

func loadCommand() *cli.Command {
	return &cli.Command{
		Name:  "load",
		Usage: "drive OpenAI-compatible endpoints with a workload or trace and report latency and goodput",
		Flags: loadFlags(),
		Action: func(c *cli.Context) error {
			cfg := loadConfig(c)
			if len(cfg.Targets) == 0 {
				return fmt.Errorf("load: at least one --target is required")
			}
			if err := checkTrace("load", cfg.Trace); err != nil {
				return err
			}
			var err error
			if cfg.TLS, err = clientTLS(c.String("ca-cert")); err != nil {
				return fmt.Errorf("load: %w", err)
			}
			closeRecords, err := openRecords(c.String("requests"), &cfg.Requests)
			if err != nil {
				return err
			}
			start := time.Now()
			rep, err := loadgen.Run(c.Context, cfg)
			err = errors.Join(err, closeRecords())
			if rep == nil {
				return err
			}
			if werr := writeReport(rep, c.String("json"), c.String("plot"), []loadgen.LoadPoint{rep.Point("run", rep.OfferedRate)}); werr != nil {
				return werr
			}
			fmt.Fprintf(os.Stderr, "load: finished in %s\n", time.Since(start).Round(time.Millisecond))
			return err
		},
	}
}

// openRecords creates the file of per-request records at path and points *w at it; close
// closes it. An empty path records nothing.
func openRecords(path string, w *io.Writer) (close func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--requests: %w", err)
	}
	*w = f
	return f.Close, nil
}

// writeReport prints the table and writes the optional JSON and SVG files.
func writeReport(rep *loadgen.Report, jsonPath, plotPath string, points []loadgen.LoadPoint) error {
	if err := rep.WriteTable(os.Stdout); err != nil {
		return err
	}
	if jsonPath != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(jsonPath, b, 0o644); err != nil {
			return err
		}
	}
	if plotPath != "" {
		f, err := os.Create(plotPath)
		if err != nil {
			return err
		}
		if err := loadgen.WriteSVG(f, points); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	return nil
}
