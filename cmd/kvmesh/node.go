package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/kvmesh/kvmesh/admit/agent"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/engine/sim"
	"github.com/kvmesh/kvmesh/node/nodeconfig"
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
		&cli.StringFlag{Name: "sim-scheduling-policy", Value: d.SchedulingPolicy, Usage: "priority (the request's priority, then arrival; vLLM's --scheduling-policy priority) or fcfs (arrival alone, vLLM's default)", EnvVars: env("sim-scheduling-policy")},
		&cli.IntFlag{Name: "sim-max-batched-tokens", Value: d.MaxNumBatchedTokens, Usage: "per-step token budget (max_num_batched_tokens; the default keeps a step with a full prefill chunk within a 100 ms TPOT)", EnvVars: env("sim-max-batched-tokens")},
	}
}

func nodeFlags() []cli.Flag {
	host, _ := os.Hostname()
	d := node.DefaultConfig()
	return append([]cli.Flag{
		&cli.StringFlag{Name: "config", Usage: "config file (JSON or YAML: node, gossip, route, admission, agents, carbon and sim sections; see README); flags and environment variables that are set override it; reloaded on SIGHUP and when it changes", EnvVars: env("config")},
		&cli.DurationFlag{Name: "config-watch", Value: d.ConfigWatch, Usage: "how often the config and API key files are checked for a change, which reloads them (0: never; SIGHUP always reloads)", EnvVars: env("config-watch")},
		&cli.BoolFlag{Name: "print-config", Usage: "print the configuration the file, flags and environment make, as a config file, and exit"},
		&cli.StringFlag{Name: "name", Value: host, Usage: "node name in the mesh", EnvVars: env("name")},
		&cli.StringFlag{Name: "http", Value: d.HTTPAddr, Usage: "listen address of the OpenAI API and /metrics", EnvVars: env("http")},
		&cli.StringFlag{Name: "admin-addr", Usage: "listen address serving /metrics, /v1/mesh/peers and the probes without an API key, for a private interface; the API listener then asks a key for /metrics and /v1/mesh/peers (default: none)", EnvVars: env("admin-addr")},
		&cli.BoolFlag{Name: "no-console", Usage: "serve no mesh console at /console (it is served on --admin-addr when set, else on the API listener behind the API key)", EnvVars: env("no-console")},
		&cli.StringFlag{Name: "engine", Value: d.Engine, Usage: "'sim' (embedded simulated engine) or the base URL of an OpenAI-compatible engine", EnvVars: env("engine")},
		&cli.StringFlag{Name: "engine-kind", Value: d.EngineKind, Usage: "metric names to scrape from an external engine: vllm, sglang, llamacpp, tgi or openai", EnvVars: env("engine-kind")},
		&cli.StringSliceFlag{Name: "model", Usage: "model name served (repeatable; default: " + node.DefaultModel + " for the sim, every model an external engine lists; an external engine must list each one given)", EnvVars: env("model")},
		&cli.DurationFlag{Name: "models-interval", Value: d.ModelsInterval, Usage: "how often an external engine's /v1/models is read again", EnvVars: env("models-interval")},
		&cli.BoolFlag{Name: "engine-priority", Usage: "send an external vLLM each request's priority (start vLLM with --scheduling-policy priority)", EnvVars: env("engine-priority")},
		&cli.StringFlag{Name: "adapter-source", Usage: "LoRA adapters to load on demand: a directory whose subdirectories are adapters, or a JSON file of adapter name to path or URI; the engine needs its runtime LoRA API (vLLM: VLLM_ALLOW_RUNTIME_LORA_UPDATING=True); off by default", EnvVars: env("adapter-source")},
		&cli.StringFlag{Name: "engine-kv-events", Usage: "an external engine's KV cache event publisher: tcp://HOST:PORT dials one that binds (vLLM/SGLang --kv-events-config endpoint, e.g. tcp://127.0.0.1:5557), bind:tcp://*:PORT listens for one that dials; off by default", EnvVars: env("engine-kv-events")},
		&cli.StringFlag{Name: "engine-messages", Usage: "whether an external engine serves the Anthropic Messages API (/v1/messages) natively: auto (the default: ask it once), on or off; where it does, Messages requests pass through untranslated", EnvVars: env("engine-messages")},
		&cli.IntFlag{Name: "engine-kv-blocks", Value: d.EngineKVBlocks, Usage: "an external engine's KV cache size in 16-token blocks when its metrics do not say it; sizes the model of what it caches", EnvVars: env("engine-kv-blocks")},
		&cli.IntFlag{Name: "engine-max-running", Value: d.EngineMaxRunning, Usage: "the most requests an external engine runs at once (vLLM --max-num-seqs, SGLang --max-running-requests, llama.cpp --parallel), advertised to peers; no engine's metrics say it", EnvVars: env("engine-max-running")},
		&cli.Int64Flag{Name: "max-body-bytes", Value: d.MaxBodyBytes, Usage: "largest request body accepted (413 above)", EnvVars: env("max-body-bytes")},
		&cli.DurationFlag{Name: "drain-delay", Value: d.DrainDelay, Usage: "how long SIGINT/SIGTERM keeps serving with /readyz at 503 before it stops accepting (negative: none)", EnvVars: env("drain-delay")},
		&cli.DurationFlag{Name: "drain-timeout", Value: d.DrainTimeout, Usage: "how long SIGINT/SIGTERM then waits for in-flight requests", EnvVars: env("drain-timeout")},
		&cli.DurationFlag{Name: "body-timeout", Value: d.BodyTimeout, Usage: "time a request, headers and body, has to arrive (408 body_timeout past it; the response may stream longer)", EnvVars: env("body-timeout")},
		&cli.DurationFlag{Name: "idle-timeout", Value: d.IdleTimeout, Usage: "close a client connection idle this long between requests", EnvVars: env("idle-timeout")},
		&cli.StringFlag{Name: "gossip", Value: net.JoinHostPort(d.Gossip.BindAddr, strconv.Itoa(d.Gossip.BindPort)), Usage: "gossip bind address (UDP and TCP; port 0 picks one)", EnvVars: env("gossip")},
		&cli.StringFlag{Name: "advertise", Usage: "host (IP or name, no port) peers reach this node at, with each bound port (default: the bound address)", EnvVars: env("advertise")},
		&cli.StringSliceFlag{Name: "join", Usage: "gossip address of a seed node (repeatable)", EnvVars: env("join")},
		&cli.StringFlag{Name: "gossip-key", Usage: "base64 AES key (16, 24 or 32 bytes) encrypting gossip; required unless --insecure-dev", EnvVars: env("gossip-key")},
		&cli.BoolFlag{Name: "insecure-dev", Usage: "allow unencrypted gossip and, without --tls-dir, trust the development CA in --dev-ca-dir (development only: the mesh is not secure)", EnvVars: env("insecure-dev")},
		&cli.StringFlag{Name: "dev-ca-dir", Usage: "with --insecure-dev: directory of the development CA the nodes of this host share, created on first use (default: kvmesh/dev-ca in the user cache directory)", EnvVars: env("dev-ca-dir")},
		&cli.StringFlag{Name: "quic", Value: d.QUICAddr, Usage: "QUIC listen address for peer forwarding (UDP)", EnvVars: env("quic")},
		&cli.DurationFlag{Name: "handshake-timeout", Value: d.HandshakeTimeout, Usage: "how long a QUIC dial to a peer, its TLS handshake included, may take before the request moves on", EnvVars: env("handshake-timeout")},
		&cli.StringFlag{Name: "tls-dir", Usage: "directory with ca.crt and NAME.crt/NAME.key (kvmesh ca)", EnvVars: env("tls-dir")},
		&cli.StringFlag{Name: "tls-cert", Usage: "PEM certificate to serve the API over HTTPS with (with --tls-key; re-read when it changes)", EnvVars: env("tls-cert")},
		&cli.StringFlag{Name: "tls-key", Usage: "PEM private key of --tls-cert", EnvVars: env("tls-key")},
		&cli.StringFlag{Name: "policy", Value: d.Policy, Usage: "routing policy: kvmesh, round-robin, least-load, cache-aware or random", EnvVars: env("policy")},
		&cli.StringFlag{Name: "stale-policy", Value: string(d.Gossip.StalePolicy), Usage: "a peer with a stale state record is not a candidate (closed) or one at its last load (open)", EnvVars: env("stale-policy")},
		&cli.StringFlag{Name: "api-keys", Usage: "API key file (sha256 tenant [rate burst [max_priority]] per line), reloaded with the config file; none means open", EnvVars: env("api-keys")},
		&cli.StringFlag{Name: "max-priority", Usage: "highest X-Kvmesh-Priority a request may ask for when its key names none or no key file is loaded (high, normal, low or an integer); unset: normal for keys, unlimited without a key file", EnvVars: env("max-priority")},
		&cli.Float64Flag{Name: "dispatch-slack", Value: d.Admit.Queue.DispatchSlack, Usage: "share of a queued request's TTFT target left to spare when it is dispatched (-1: none)", EnvVars: env("dispatch-slack")},
		&cli.IntFlag{Name: "forward-attempts", Value: d.ForwardAttempts, Usage: "candidates one dispatch tries before the request goes back to the waiting room", EnvVars: env("forward-attempts")},
		&cli.IntFlag{Name: "migrations", Value: d.Migrations, Usage: "times one request may move to another node when its owner, or its engine, fails mid-response (-1: never)", EnvVars: env("migrations")},
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
	setString(c, "sim-scheduling-policy", &cfg.Sim.SchedulingPolicy)
}

// loraConfig sets the engine command's LoRA flags on cfg.
func loraConfig(c *cli.Context, cfg *sim.Config) error {
	setInt(c, "max-loras", &cfg.MaxLoRAs)
	if c.IsSet("lora-load-time") {
		cfg.LoRALoadTime = c.Duration("lora-load-time")
	}
	for _, m := range c.StringSlice("lora-modules") {
		name, path, ok := strings.Cut(m, "=")
		if !ok || name == "" || path == "" {
			return fmt.Errorf("--lora-modules %q: want NAME=PATH", m)
		}
		if cfg.LoRAModules == nil {
			cfg.LoRAModules = map[string]string{}
		}
		cfg.LoRAModules[name] = path
	}
	return nil
}

// nodeConfig builds the node's configuration: DefaultConfig, then the --config file, then the
// flags and environment variables that are set (a flag over its variable: urfave/cli reads the
// variable only when the flag is absent). It reads the config file and nothing else
// (loadNodeFiles reads the certificates and tokens a running node needs). The node reads the
// file again on a reload and applies the same flags and variables over it (Config.Overrides).
func nodeConfig(c *cli.Context) (node.Config, error) {
	cfg := node.DefaultConfig()
	log, err := newLogger(c)
	if err != nil {
		return cfg, err
	}
	cfg.Logger = log // a key under its former name is a WARN
	if f := c.String("config"); f != "" {
		var legacy bool
		if cfg, legacy, err = nodeconfig.ReadConfigFile(f, cfg); err != nil {
			return cfg, fmt.Errorf("--config %s: %w", f, err)
		}
		if legacy {
			log.Warn("the config file holds admission settings alone, a format that is deprecated: put them in its \"admission\" section", "file", f)
		}
	}
	cfg.Logger = log
	if err := flagConfig(c, &cfg); err != nil {
		return cfg, err
	}
	cfg.Overrides = func(next *node.Config) error { return flagConfig(c, next) }
	cfg.ConfigWatch = c.Duration("config-watch")
	if cfg.ConfigWatch <= 0 {
		cfg.ConfigWatch = -1 // the flag's 0 is off; the config's is the default
	}
	return cfg, nil
}

// flagConfig maps the flags and environment variables that are set onto cfg.
func flagConfig(c *cli.Context, cfg *node.Config) error {
	if c.IsSet("name") || cfg.Name == "" {
		cfg.Name = c.String("name")
	}
	setString(c, "http", &cfg.HTTPAddr)
	setString(c, "admin-addr", &cfg.AdminAddr)
	setBool(c, "no-console", &cfg.NoConsole)
	setString(c, "engine", &cfg.Engine)
	setString(c, "engine-kind", &cfg.EngineKind)
	setInt(c, "engine-kv-blocks", &cfg.EngineKVBlocks)
	setInt(c, "engine-max-running", &cfg.EngineMaxRunning)
	setBool(c, "engine-priority", &cfg.EnginePriority)
	setString(c, "engine-kv-events", &cfg.EngineKVEvents)
	setString(c, "engine-messages", &cfg.EngineMessages)
	setString(c, "adapter-source", &cfg.AdapterSource)
	setStrings(c, "model", &cfg.Models)
	setDuration(c, "models-interval", &cfg.ModelsInterval)
	setInt64(c, "max-body-bytes", &cfg.MaxBodyBytes)
	setDuration(c, "drain-delay", &cfg.DrainDelay)
	setDuration(c, "drain-timeout", &cfg.DrainTimeout)
	setDuration(c, "body-timeout", &cfg.BodyTimeout)
	setDuration(c, "idle-timeout", &cfg.IdleTimeout)
	setFloat(c, "dispatch-slack", &cfg.Admit.Queue.DispatchSlack)
	setInt(c, "forward-attempts", &cfg.ForwardAttempts)
	setInt(c, "migrations", &cfg.Migrations)
	setDuration(c, "retry-after", &cfg.RetryAfter)
	setInt(c, "max-agent-id-bytes", &cfg.MaxAgentIDBytes)
	setString(c, "otlp-endpoint", &cfg.OTLPEndpoint)
	setFloat(c, "trace-sample", &cfg.TraceSample)
	simConfig(c, cfg)
	if err := meshConfig(c, cfg); err != nil {
		return err
	}
	agentConfig(c, cfg)
	return nil
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
				return printConfig(c.App.Writer, cfg, "json")
			}
			if err := loadNodeFiles(&cfg); err != nil {
				return err
			}
			return runNode(c.Context, cfg)
		},
	}
}

// runNode starts a node and serves until ctx ends (SIGINT/SIGTERM), then drains and exits; a
// second signal ends the process at once (stopOnSignals). SIGHUP reloads the config and API
// key files (node.Reload).
func runNode(ctx context.Context, cfg node.Config) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP) // from now on, not the default: ending the process
	defer signal.Stop(hup)
	n, err := node.New(cfg)
	if err != nil {
		return err
	}
	if err := n.Start(ctx); err != nil {
		_ = n.Shutdown(context.Background())
		return err
	}
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-hup:
			_ = n.Reload() // the node logs what became of each file
		}
	}
	if cfg.Logger != nil {
		cfg.Logger.Info("stopping: a second SIGINT or SIGTERM exits at once, without waiting for the drain")
	}
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
			&cli.StringFlag{Name: "kv-events", Usage: "publish KV cache events as vLLM's --kv-events-config does, on this endpoint (tcp://127.0.0.1:5557, tcp://*:5557); off by default", EnvVars: env("engine-publish-kv-events")},
			&cli.StringSliceFlag{Name: "lora-modules", Usage: "a LoRA adapter served from the start, as NAME=PATH, an adapter of the first model (repeatable; vLLM's --lora-modules); POST /v1/load_lora_adapter adds more", EnvVars: env("engine-lora-modules")},
			&cli.IntFlag{Name: "max-loras", Value: sim.DefaultConfig().MaxLoRAs, Usage: "GPU adapter slots: the most distinct LoRA adapters one batch holds (vLLM's --max-loras)", EnvVars: env("engine-max-loras")},
			&cli.DurationFlag{Name: "lora-load-time", Value: sim.DefaultConfig().LoRALoadTime, Usage: "simulated time to bring a LoRA adapter into a GPU slot", EnvVars: env("engine-lora-load-time")},
			&cli.StringFlag{Name: "role", Value: sim.RoleMixed, Usage: "mixed, prefill or decode: a prefill engine answers only requests whose kv_transfer_params ask for a remote decode, as a vLLM prefill server with a KV connector; a decode engine only those that name a prefill engine's handover", EnvVars: env("engine-role")},
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
			// A node in front of it watches its models and metrics, not its /readyz.
			cfg.DrainDelay = -1
			setStrings(c, "model", &cfg.Models)
			setString(c, "kv-events", &cfg.PublishKVEvents)
			setString(c, "role", &cfg.Sim.Role)
			simConfig(c, &cfg)
			if err := loraConfig(c, &cfg.Sim); err != nil {
				return err
			}
			return runNode(c.Context, cfg)
		},
	}
}
