package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/urfave/cli/v2"

	"github.com/kvmesh/kvmesh/admit/agent"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/engine/sim"
)

// simFlags are the embedded engine's knobs, shared by `kvmesh node`, `kvmesh engine` and
// `kvmesh testnet`.
func simFlags() []cli.Flag {
	d := sim.DefaultConfig()
	return []cli.Flag{
		&cli.Float64Flag{Name: "time-scale", Value: d.TimeScale, Usage: "run the simulated engine this many times faster than real time", EnvVars: env("time-scale")},
		&cli.IntFlag{Name: "sim-kv-blocks", Value: d.KVBlocks, Usage: "KV cache size in blocks (0: derived from the GPU memory and the model's KV bytes per token)", EnvVars: env("sim-kv-blocks")},
		&cli.IntFlag{Name: "sim-block-tokens", Value: d.BlockTokens, Usage: "tokens per KV block", EnvVars: env("sim-block-tokens")},
		&cli.IntFlag{Name: "sim-max-num-seqs", Value: d.MaxNumSeqs, Usage: "cap on running sequences (max_num_seqs)", EnvVars: env("sim-max-num-seqs")},
		&cli.IntFlag{Name: "sim-max-batched-tokens", Value: d.MaxNumBatchedTokens, Usage: "per-step token budget (max_num_batched_tokens; the default keeps a step with a full prefill chunk within a 100 ms TPOT)", EnvVars: env("sim-max-batched-tokens")},
	}
}

func nodeFlags() []cli.Flag {
	host, _ := os.Hostname()
	d := node.DefaultConfig()
	return append([]cli.Flag{
		&cli.StringFlag{Name: "config", Usage: "config file (JSON: node, gossip, route, admission, agents, carbon and sim sections; see README); flags and environment variables that are set override it", EnvVars: env("config")},
		&cli.BoolFlag{Name: "print-config", Usage: "print the configuration the file, flags and environment make, as a config file, and exit"},
		&cli.StringFlag{Name: "name", Value: host, Usage: "node name in the mesh", EnvVars: env("name")},
		&cli.StringFlag{Name: "http", Value: d.HTTPAddr, Usage: "listen address of the OpenAI API and /metrics", EnvVars: env("http")},
		&cli.StringFlag{Name: "engine", Value: d.Engine, Usage: "'sim' (embedded simulated engine) or the base URL of an OpenAI-compatible engine", EnvVars: env("engine")},
		&cli.StringFlag{Name: "engine-kind", Value: d.EngineKind, Usage: "metric names to scrape from an external engine: vllm, sglang, llamacpp, tgi or openai", EnvVars: env("engine-kind")},
		&cli.StringSliceFlag{Name: "model", Usage: "model name served (repeatable; default: " + node.DefaultModel + " for the sim, every model an external engine lists; an external engine must list each one given)", EnvVars: env("model")},
		&cli.DurationFlag{Name: "models-interval", Value: d.ModelsInterval, Usage: "how often an external engine's /v1/models is read again", EnvVars: env("models-interval")},
		&cli.BoolFlag{Name: "engine-priority", Usage: "send an external vLLM each request's priority (start vLLM with --scheduling-policy priority)", EnvVars: env("engine-priority")},
		&cli.IntFlag{Name: "engine-kv-blocks", Value: d.EngineKVBlocks, Usage: "an external engine's KV cache size in 16-token blocks when its metrics do not say it; sizes the model of what it caches", EnvVars: env("engine-kv-blocks")},
		&cli.Int64Flag{Name: "max-body-bytes", Value: d.MaxBodyBytes, Usage: "largest request body accepted (413 above)", EnvVars: env("max-body-bytes")},
		&cli.DurationFlag{Name: "drain-timeout", Value: d.DrainTimeout, Usage: "how long SIGINT/SIGTERM waits for in-flight requests", EnvVars: env("drain-timeout")},
		&cli.StringFlag{Name: "gossip", Value: net.JoinHostPort(d.Gossip.BindAddr, strconv.Itoa(d.Gossip.BindPort)), Usage: "gossip bind address (UDP and TCP; port 0 picks one)", EnvVars: env("gossip")},
		&cli.StringFlag{Name: "advertise", Usage: "address peers reach this node at (default: the bound address)", EnvVars: env("advertise")},
		&cli.StringSliceFlag{Name: "join", Usage: "gossip address of a seed node (repeatable)", EnvVars: env("join")},
		&cli.StringFlag{Name: "gossip-key", Usage: "base64 AES key (16, 24 or 32 bytes) encrypting gossip; required unless --insecure-dev", EnvVars: env("gossip-key")},
		&cli.BoolFlag{Name: "insecure-dev", Usage: "allow unencrypted gossip and a throwaway TLS CA (development only)", EnvVars: env("insecure-dev")},
		&cli.StringFlag{Name: "quic", Value: d.QUICAddr, Usage: "QUIC listen address for peer forwarding (UDP)", EnvVars: env("quic")},
		&cli.StringFlag{Name: "tls-dir", Usage: "directory with ca.crt and NAME.crt/NAME.key (kvmesh ca)", EnvVars: env("tls-dir")},
		&cli.StringFlag{Name: "policy", Value: d.Policy, Usage: "routing policy: kvmesh, round-robin, least-load, cache-aware or random", EnvVars: env("policy")},
		&cli.StringFlag{Name: "stale-policy", Value: string(d.Gossip.StalePolicy), Usage: "a peer with a stale state record is not a candidate (closed) or one at its last load (open)", EnvVars: env("stale-policy")},
		&cli.StringFlag{Name: "api-keys", Usage: "API key file (sha256 tenant [rate burst [max_priority]] per line), hot-reloaded; none means open", EnvVars: env("api-keys")},
		&cli.StringFlag{Name: "max-priority", Usage: "highest X-Kvmesh-Priority a request may ask for when its key names none or no key file is loaded (high, normal, low or an integer); unset: normal for keys, unlimited without a key file", EnvVars: env("max-priority")},
		&cli.Float64Flag{Name: "dispatch-slack", Value: d.Admit.Queue.DispatchSlack, Usage: "share of a queued request's TTFT target left to spare when it is dispatched (-1: none)", EnvVars: env("dispatch-slack")},
		&cli.IntFlag{Name: "forward-attempts", Value: d.ForwardAttempts, Usage: "candidates one dispatch tries before the request goes back to the waiting room", EnvVars: env("forward-attempts")},
		&cli.DurationFlag{Name: "retry-after", Value: d.RetryAfter, Usage: "Retry-After of a refusal with no better estimate", EnvVars: env("retry-after")},
		&cli.BoolFlag{Name: "agent-from-user", Usage: "take the agent id from the OpenAI user field when X-Kvmesh-Agent is absent", EnvVars: env("agent-from-user")},
		&cli.IntFlag{Name: "max-agent-id-bytes", Value: d.MaxAgentIDBytes, Usage: "longest agent id accepted", EnvVars: env("max-agent-id-bytes")},
		&cli.IntFlag{Name: "agent-window", Usage: "turn on agent-level admission with at most this many active agents per node (0: off)", EnvVars: env("agent-window")},
		&cli.DurationFlag{Name: "agent-idle-timeout", Value: agent.DefaultConfig().IdleTimeout, Usage: "an agent silent this long leaves the window", EnvVars: env("agent-idle-timeout")},
		&cli.DurationFlag{Name: "agent-interval", Value: d.AgentInterval, Usage: "control interval of the agent window", EnvVars: env("agent-interval")},
		&cli.IntFlag{Name: "agent-lease-intervals", Value: d.AgentLeaseIntervals, Usage: "intervals a step held for the window may go without its ingress renewing the hold", EnvVars: env("agent-lease-intervals")},
		&cli.StringFlag{Name: "gpu", Value: d.GPU, Usage: "GPU telemetry: auto, nvml, none or sim", EnvVars: env("gpu")},
		&cli.StringFlag{Name: "otlp-endpoint", Usage: "send traces over OTLP/HTTP to this collector: host:port (plain HTTP, /v1/traces) or a URL; none: tracing off", EnvVars: env("otlp-endpoint")},
		&cli.Float64Flag{Name: "trace-sample", Value: d.TraceSample, Usage: "share of new traces sampled (a client's traceparent decides for its own; -1: none)", EnvVars: env("trace-sample")},
	}, append(carbonFlags(), simFlags()...)...)
}

// The set* helpers copy a flag's value to dst only when the flag or its environment variable
// is set, so that a config file's value stands otherwise.

func setString(c *cli.Context, flag string, dst *string) {
	if c.IsSet(flag) {
		*dst = c.String(flag)
	}
}

func setStrings(c *cli.Context, flag string, dst *[]string) {
	if c.IsSet(flag) {
		*dst = c.StringSlice(flag)
	}
}

func setInt(c *cli.Context, flag string, dst *int) {
	if c.IsSet(flag) {
		*dst = c.Int(flag)
	}
}

func setInt64(c *cli.Context, flag string, dst *int64) {
	if c.IsSet(flag) {
		*dst = c.Int64(flag)
	}
}

func setFloat(c *cli.Context, flag string, dst *float64) {
	if c.IsSet(flag) {
		*dst = c.Float64(flag)
	}
}

func setDuration[D ~int64](c *cli.Context, flag string, dst *D) {
	if c.IsSet(flag) {
		*dst = D(c.Duration(flag))
	}
}

func setBool(c *cli.Context, flag string, dst *bool) {
	if c.IsSet(flag) {
		*dst = c.Bool(flag)
	}
}

// simConfig maps the sim flags that are set onto cfg.Sim.
func simConfig(c *cli.Context, cfg *node.Config) {
	setFloat(c, "time-scale", &cfg.Sim.TimeScale)
	setInt(c, "sim-kv-blocks", &cfg.Sim.KVBlocks)
	setInt(c, "sim-block-tokens", &cfg.Sim.BlockTokens)
	setInt(c, "sim-max-num-seqs", &cfg.Sim.MaxNumSeqs)
	setInt(c, "sim-max-batched-tokens", &cfg.Sim.MaxNumBatchedTokens)
}

// nodeConfig builds the node's configuration: DefaultConfig, then the --config file, then the
// flags and environment variables that are set. It reads the config file and nothing else
// (loadNodeFiles reads the certificates and tokens a running node needs).
func nodeConfig(c *cli.Context) (node.Config, error) {
	cfg := node.DefaultConfig()
	log, err := newLogger(c)
	if err != nil {
		return cfg, err
	}
	if f := c.String("config"); f != "" {
		data, err := os.ReadFile(f)
		if err != nil {
			return cfg, fmt.Errorf("--config: %w", err)
		}
		if node.ConfigFileIsLegacy(data) {
			log.Warn("the config file holds admission settings alone, a format that is deprecated: put them in its \"admission\" section", "file", f)
		}
		if cfg, err = node.LoadConfigFile(data, cfg); err != nil {
			return cfg, fmt.Errorf("--config %s: %w", f, err)
		}
	}
	cfg.Logger = log
	if c.IsSet("name") || cfg.Name == "" {
		cfg.Name = c.String("name")
	}
	setString(c, "http", &cfg.HTTPAddr)
	setString(c, "engine", &cfg.Engine)
	setString(c, "engine-kind", &cfg.EngineKind)
	setInt(c, "engine-kv-blocks", &cfg.EngineKVBlocks)
	setBool(c, "engine-priority", &cfg.EnginePriority)
	setStrings(c, "model", &cfg.Models)
	setDuration(c, "models-interval", &cfg.ModelsInterval)
	setInt64(c, "max-body-bytes", &cfg.MaxBodyBytes)
	setDuration(c, "drain-timeout", &cfg.DrainTimeout)
	setFloat(c, "dispatch-slack", &cfg.Admit.Queue.DispatchSlack)
	setInt(c, "forward-attempts", &cfg.ForwardAttempts)
	setDuration(c, "retry-after", &cfg.RetryAfter)
	setInt(c, "max-agent-id-bytes", &cfg.MaxAgentIDBytes)
	setString(c, "otlp-endpoint", &cfg.OTLPEndpoint)
	setFloat(c, "trace-sample", &cfg.TraceSample)
	simConfig(c, &cfg)
	if err := meshConfig(c, &cfg); err != nil {
		return cfg, err
	}
	agentConfig(c, &cfg)
	return cfg, nil
}

// agentConfig maps the agent flags: --agent-window turns agent admission on (over the file's
// agents section, if any) or, at 0, off.
func agentConfig(c *cli.Context, cfg *node.Config) {
	if c.IsSet("agent-window") {
		if w := c.Int("agent-window"); w > 0 {
			ac := agent.DefaultConfig()
			if cfg.Agents != nil {
				ac = *cfg.Agents
			}
			ac.Controller.MaxWindow = w
			ac.Controller.InitialWindow = min(ac.Controller.InitialWindow, w)
			cfg.Agents = &ac
		} else {
			cfg.Agents = nil
		}
	}
	if cfg.Agents != nil && c.IsSet("agent-idle-timeout") {
		ac := *cfg.Agents
		ac.IdleTimeout = c.Duration("agent-idle-timeout")
		cfg.Agents = &ac
	}
	setDuration(c, "agent-interval", &cfg.AgentInterval)
	setInt(c, "agent-lease-intervals", &cfg.AgentLeaseIntervals)
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
			if c.Bool("print-config") {
				return printConfig(c.App.Writer, cfg)
			}
			if err := loadNodeFiles(&cfg); err != nil {
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

// The engine command's own defaults: it usually runs beside a node on the same host.
const (
	engineHTTPAddr = ":8000"
	engineName     = "engine"
)

func engineCommand() *cli.Command {
	return &cli.Command{
		Name:  "engine",
		Usage: "serve the embedded simulated engine alone (OpenAI API and vLLM metrics), as an external engine for a node",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "http", Value: engineHTTPAddr, Usage: "listen address", EnvVars: env("engine-http")},
			&cli.StringFlag{Name: "name", Value: engineName, Usage: "name reported in X-Kvmesh-Node", EnvVars: env("engine-name")},
			&cli.StringSliceFlag{Name: "model", Usage: "model name served (repeatable; default " + node.DefaultModel + ")", EnvVars: env("engine-model")},
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
			setStrings(c, "model", &cfg.Models)
			simConfig(c, &cfg)
			return runNode(c.Context, cfg)
		},
	}
}
