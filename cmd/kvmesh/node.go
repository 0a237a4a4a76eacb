package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kvmesh/kvmesh/admit/agent"
	"github.com/kvmesh/kvmesh/node"
)

// simFlags are the embedded engine's knobs, shared by `kvmesh node` and `kvmesh engine`.
func simFlags() []cli.Flag {
	return []cli.Flag{
		&cli.Float64Flag{Name: "time-scale", Value: 1, Usage: "run the simulated engine this many times faster than real time", EnvVars: env("time-scale")},
		&cli.IntFlag{Name: "sim-kv-blocks", Usage: "KV cache size in blocks (0: derived from the GPU memory and the model's KV bytes per token)", EnvVars: env("sim-kv-blocks")},
		&cli.IntFlag{Name: "sim-block-tokens", Value: 16, Usage: "tokens per KV block", EnvVars: env("sim-block-tokens")},
		&cli.IntFlag{Name: "sim-max-num-seqs", Value: 256, Usage: "cap on running sequences (max_num_seqs)", EnvVars: env("sim-max-num-seqs")},
		&cli.IntFlag{Name: "sim-max-batched-tokens", Value: 2048, Usage: "per-step token budget (max_num_batched_tokens; 2048 keeps a step with a full prefill chunk within a 100 ms TPOT)", EnvVars: env("sim-max-batched-tokens")},
	}
}

func nodeFlags() []cli.Flag {
	host, _ := os.Hostname()
	return append([]cli.Flag{
		&cli.StringFlag{Name: "name", Value: host, Usage: "node name in the mesh", EnvVars: env("name")},
		&cli.StringFlag{Name: "http", Value: ":8080", Usage: "listen address of the OpenAI API and /metrics", EnvVars: env("http")},
		&cli.StringFlag{Name: "engine", Value: "sim", Usage: "'sim' (embedded simulated engine) or the base URL of an OpenAI-compatible engine", EnvVars: env("engine")},
		&cli.StringFlag{Name: "engine-kind", Value: "vllm", Usage: "metric names to scrape from an external engine: vllm, sglang, llamacpp, tgi or openai", EnvVars: env("engine-kind")},
		&cli.StringSliceFlag{Name: "model", Usage: "model name served (repeatable; default " + node.DefaultModel + " for the sim)", EnvVars: env("model")},
		&cli.Int64Flag{Name: "max-body-bytes", Value: 4 << 20, Usage: "largest request body accepted (413 above)", EnvVars: env("max-body-bytes")},
		&cli.DurationFlag{Name: "drain-timeout", Value: 30 * time.Second, Usage: "how long SIGINT/SIGTERM waits for in-flight requests", EnvVars: env("drain-timeout")},
		&cli.StringFlag{Name: "gossip", Value: ":7946", Usage: "gossip bind address (UDP and TCP)", EnvVars: env("gossip")},
		&cli.StringFlag{Name: "advertise", Usage: "address peers reach this node at (default: the bound address)", EnvVars: env("advertise")},
		&cli.StringSliceFlag{Name: "join", Usage: "gossip address of a seed node (repeatable)", EnvVars: env("join")},
		&cli.StringFlag{Name: "gossip-key", Usage: "base64 AES key (16, 24 or 32 bytes) encrypting gossip; required unless --insecure-dev", EnvVars: env("gossip-key")},
		&cli.BoolFlag{Name: "insecure-dev", Usage: "allow unencrypted gossip and a throwaway TLS CA (development only)", EnvVars: env("insecure-dev")},
		&cli.StringFlag{Name: "quic", Value: ":7443", Usage: "QUIC listen address for peer forwarding (UDP)", EnvVars: env("quic")},
		&cli.StringFlag{Name: "tls-dir", Usage: "directory with ca.crt and NAME.crt/NAME.key (kvmesh ca)", EnvVars: env("tls-dir")},
		&cli.StringFlag{Name: "policy", Value: "kvmesh", Usage: "routing policy: kvmesh, round-robin, least-load, cache-aware or random", EnvVars: env("policy")},
		&cli.StringFlag{Name: "stale-policy", Value: "closed", Usage: "a peer with a stale state record is not a candidate (closed) or one at its last load (open)", EnvVars: env("stale-policy")},
		&cli.StringFlag{Name: "config", Usage: "admission config file (JSON; see README)", EnvVars: env("config")},
		&cli.StringFlag{Name: "api-keys", Usage: "API key file (sha256 tenant [rate burst] per line), hot-reloaded; none means open", EnvVars: env("api-keys")},
		&cli.BoolFlag{Name: "agent-from-user", Usage: "take the agent id from the OpenAI user field when X-Kvmesh-Agent is absent", EnvVars: env("agent-from-user")},
		&cli.IntFlag{Name: "agent-window", Usage: "turn on agent-level admission with at most this many active agents per node (0: off)", EnvVars: env("agent-window")},
		&cli.DurationFlag{Name: "agent-idle-timeout", Value: agent.DefaultConfig().IdleTimeout, Usage: "an agent silent this long leaves the window", EnvVars: env("agent-idle-timeout")},
		&cli.DurationFlag{Name: "agent-interval", Value: node.DefaultAgentInterval, Usage: "control interval of the agent window", EnvVars: env("agent-interval")},
		&cli.StringFlag{Name: "gpu", Value: "auto", Usage: "GPU telemetry: auto, nvml, none or sim", EnvVars: env("gpu")},
	}, append(carbonFlags(), simFlags()...)...)
}

// simConfig maps the sim flags onto cfg.Sim.
func simConfig(c *cli.Context, cfg *node.Config) {
	cfg.Sim.TimeScale = c.Float64("time-scale")
	cfg.Sim.KVBlocks = c.Int("sim-kv-blocks")
	cfg.Sim.BlockTokens = c.Int("sim-block-tokens")
	cfg.Sim.MaxNumSeqs = c.Int("sim-max-num-seqs")
	cfg.Sim.MaxNumBatchedTokens = c.Int("sim-max-batched-tokens")
}

func nodeConfig(c *cli.Context) (node.Config, error) {
	cfg := node.DefaultConfig()
	log, err := newLogger(c)
	if err != nil {
		return cfg, err
	}
	cfg.Logger = log
	cfg.Name = c.String("name")
	cfg.HTTPAddr = c.String("http")
	cfg.Engine = c.String("engine")
	cfg.EngineKind = c.String("engine-kind")
	if m := c.StringSlice("model"); len(m) > 0 {
		cfg.Models = m
	}
	cfg.MaxBodyBytes = c.Int64("max-body-bytes")
	cfg.DrainTimeout = c.Duration("drain-timeout")
	simConfig(c, &cfg)
	if err := meshConfig(c, &cfg); err != nil {
		return cfg, err
	}
	if w := c.Int("agent-window"); w > 0 {
		ac := agent.DefaultConfig()
		ac.Controller.MaxWindow = w
		ac.Controller.InitialWindow = min(ac.Controller.InitialWindow, w)
		ac.IdleTimeout = c.Duration("agent-idle-timeout")
		cfg.Agents = &ac
	}
	cfg.AgentInterval = c.Duration("agent-interval")
	return cfg, nil
}

func nodeCommand() *cli.Command {
	return &cli.Command{
		Name:  "node",
		Usage: "run a kvmesh node next to an inference engine",
		Flags: nodeFlags(),
		Action: func(c *cli.Context) error {
			cfg, err := nodeConfig(c)
			if err != nil {
				return err
			}
			return runNode(c.Context, cfg)
		},
	}
}

// runNode starts a node and serves until ctx ends (SIGINT/SIGTERM), then drains and exits.
func runNode(ctx context.Context, cfg node.Config) error {
	n, err := node.New(cfg)
	if err != nil {
		return err
	}
	if err := n.Start(ctx); err != nil {
		_ = n.Shutdown(context.Background())
		return err
	}
	<-ctx.Done()
	cfg.Logger.Info("draining", "timeout", cfg.DrainTimeout)
	if err := n.Shutdown(context.Background()); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

func engineCommand() *cli.Command {
	return &cli.Command{
		Name:  "engine",
		Usage: "serve the embedded simulated engine alone (OpenAI API and vLLM metrics), as an external engine for a node",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "http", Value: ":8000", Usage: "listen address", EnvVars: env("engine-http")},
			&cli.StringFlag{Name: "name", Value: "engine", Usage: "name reported in X-Kvmesh-Node", EnvVars: env("engine-name")},
			&cli.StringSliceFlag{Name: "model", Usage: "model name served (repeatable)", EnvVars: env("engine-model")},
		}, simFlags()...),
		Action: func(c *cli.Context) error {
			cfg := node.DefaultConfig()
			log, err := newLogger(c)
			if err != nil {
				return err
			}
			cfg.Logger = log
			cfg.Name = c.String("name")
			cfg.HTTPAddr = c.String("http")
			cfg.Standalone = true
			if m := c.StringSlice("model"); len(m) > 0 {
				cfg.Models = m
			}
			simConfig(c, &cfg)
			return runNode(c.Context, cfg)
		},
	}
}
