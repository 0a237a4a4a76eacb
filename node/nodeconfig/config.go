package nodeconfig

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/agent"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/carbon"
	"github.com/kvmesh/kvmesh/carbon/provider"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/node/engine/external"
	"github.com/kvmesh/kvmesh/node/engine/sim"
	"github.com/kvmesh/kvmesh/node/tracing"
	"github.com/kvmesh/kvmesh/node/transport"
)

// Config configures one node.
//
// # The zero rule
//
// Every kvmesh config follows one rule: a zero field means its default, DefaultConfig's value,
// which node.New fills in (Fill; each sub-config's own New fills its fields the same way), so a Config
// that sets only what it needs is complete. A setting that can be turned off is turned off by
// an explicit field, never by zero: a nil pointer (Agents, Carbon), a bool
// (route.Config.DisablePowerCapFilter), or the negative value its documentation names
// (admit's queue.backfill -1, route's weights -1, gossip.AnyPort). Negative values elsewhere
// are errors. A config file's 0 for an admission setting that 0 once turned off
// (queue.backfill) is refused, not read as the default (admit.DecodeConfig), so an old file
// cannot change meaning unseen.
//
// The JSON names are those of the config file's "node" section; the sub-configs are sections
// of their own (see LoadConfigFile).
type Config struct {
	// Name identifies the node in the mesh and in X-Kvmesh-Node; required (kvmesh node
	// defaults it to the host name).
	Name string `json:"name"`
	// HTTPAddr is the API's listen address (default ":8080"); port 0 picks a free port.
	HTTPAddr string `json:"http_addr"`
	// AdminAddr, if set, is a second listen address serving /metrics, /v1/mesh/peers, /healthz
	// and /readyz without an API key, meant for a private interface; the API listener then
	// asks a key for /metrics and /v1/mesh/peers even without a key file. Empty, the default:
	// no admin listener, and the API listener asks a key for them only while a key file is
	// loaded.
	AdminAddr string `json:"admin_addr"`
	// NoConsole turns the mesh console (/console) off. On, the default, it is served on the
	// admin listener when there is one, else on the API listener behind the API key while a
	// key file is loaded.
	NoConsole bool `json:"no_console"`
	// Engine is "sim" (the embedded simulated engine, the default) or the base URL of an
	// external OpenAI-compatible engine, whose metric names EngineKind selects (default "vllm").
	Engine     string `json:"engine"`
	EngineKind string `json:"engine_kind"`
	// EngineKVBlocks is an external engine's KV cache size in blocks of 16 tokens when its
	// metrics do not say it (vLLM's and SGLang's do); it sizes the model of what the engine
	// caches. Default 4096.
	EngineKVBlocks int `json:"engine_kv_blocks,advanced"`
	// EngineMaxRunning is the most requests an external engine runs at once (vLLM's
	// --max-num-seqs, SGLang's --max-running-requests, llama.cpp's --parallel); no engine's
	// metrics say it. The node advertises it as its engine's max_running, which routing uses
	// to judge how busy the engine is and how large its decode batch can grow. Default 256.
	// The embedded engine reports its own sim.max_num_seqs.
	EngineMaxRunning int `json:"engine_max_running"`
	// EnginePriority sends an external vLLM each request's priority in its priority field
	// (negated: vLLM runs a lower value first) and advertises that the engine schedules by it,
	// so admission counts only the queued prefill ahead of a request's class. vLLM must run
	// with --scheduling-policy priority: without it, it refuses a non-zero priority. Only for
	// EngineKind "vllm" (New fails otherwise); off by default. The embedded engine schedules
	// by priority whatever this says.
	EnginePriority bool `json:"engine_priority"`
	// EngineKVEvents is an external engine's KV cache event publisher (vLLM's and SGLang's
	// --kv-events-config endpoint), tcp://host:port, e.g. tcp://127.0.0.1:5557; empty, the
	// default, reads none. The events tell the node at once when the engine clears its cache
	// and how much it evicts (see docs/design/engine.md). External engines only.
	EngineKVEvents string `json:"engine_kv_events"`
	// EngineMessages says whether an external engine serves the Anthropic Messages API (POST
	// /v1/messages) natively: "on", "off", or "auto" (also "", the default), which asks the
	// engine once at start (an empty body: a 404 or 405 means no). Where it does, a Messages
	// request is passed to it as the client sent it and its answer reaches the client as the
	// engine wrote it; elsewhere the request is translated to chat (docs/design/engine.md).
	EngineMessages string `json:"engine_messages"`
	// PublishKVEvents has the embedded engine publish its KV cache events in vLLM's format on
	// this endpoint (tcp://host:port; kvmesh engine --kv-events); empty, the default, publishes
	// none.
	PublishKVEvents string `json:"-"`
	// Models lists the model names served. Default: DefaultModel with the sim engine, which
	// gives each the sim's context size; with an external engine, every model its GET
	// /v1/models lists. Given with an external engine, each must be one the engine lists (Start
	// fails naming it otherwise), and the node serves those of them the engine lists now.
	Models []string `json:"models"`
	// ModelsInterval is how often an external engine's GET /v1/models is read again (default
	// 30s); a failed read is retried every second. Models that appear or disappear there are
	// advertised or withdrawn, and the node is unready while the engine does not answer or
	// serves none of its models.
	ModelsInterval time.Duration `json:"models_interval,advanced"`
	// AdapterSource is where LoRA adapters are loaded on demand from: a directory whose
	// subdirectories are adapters, or a JSON file mapping an adapter name to its path or URI
	// (or to {"path", "base"}), read at Start (node/lora.ReadSource). Each adapter of it is a
	// model of the node while the node serves its base model (the entry's base, else the
	// engine's first), and a request for one the engine does not hold loads it first through
	// the engine's runtime API. Empty, the default: no loading on demand.
	AdapterSource string `json:"adapter_source"`
	// AdapterMaxLoaded is how many adapters the engine may hold at once before a load unloads
	// the least recently used idle one (default 0: the engine's adapter slots, vLLM's
	// max_lora as its metrics say; no bound when unknown, as for SGLang).
	AdapterMaxLoaded int `json:"adapter_max_loaded,advanced"`
	// AdapterLoadTimeout bounds a load on demand and a request's wait for it (default 30s).
	AdapterLoadTimeout time.Duration `json:"adapter_load_timeout,advanced"`
	// Sim configures the embedded engine (its Models and OnPrefix are set by the node). Its
	// vLLM-named metrics go on the node's registry in Standalone (kvmesh engine), and otherwise
	// on Sim.Registerer as the caller set it (nil: nowhere), never on the node's /metrics.
	// File section "sim".
	Sim sim.Config `json:"-"`
	// Standalone serves the engine alone: no gossip, no forwarding (kvmesh engine).
	Standalone bool `json:"-"`
	// Role is the node's part in disaggregated prefill and decode (docs/design/disaggregation.md):
	// "" or "mixed" (the default) runs whole requests and either half of a split one, "prefill"
	// only prefill halves, "decode" only decode halves; any other word is a label that runs
	// whole requests as mixed does, for route.roles to select (an ingress-only node's role, say)
	// and is no candidate for either half. It is gossiped, and given to the embedded engine: a
	// prefill or decode role named in either node.role or sim.role is both's (the two may not
	// name different ones). In front of an external engine, prefill and decode need
	// engine_kind vllm: a server with a KV connector, whose kv_transfer_params are the handover.
	Role string `json:"role"`

	// Gossip configures the mesh member (Name, Logger and Registerer are the node's). File
	// section "gossip".
	Gossip gossip.Config `json:"-"`
	// QUICAddr is the UDP listen address for peer forwarding (default ":7443") and TLS the
	// cluster's mTLS configuration (transport.LoadTLS); both are required outside Standalone.
	QUICAddr string      `json:"quic_addr"`
	TLS      *tls.Config `json:"-"`
	// HandshakeTimeout bounds a QUIC dial to a peer, its TLS handshake included. Default 500ms,
	// sized for a LAN, where a handshake takes a millisecond or two: a peer that died without
	// a word (its UDP port silent) costs the request that meets it this long before the next
	// candidate, where quic-go's own default would cost 5s.
	HandshakeTimeout time.Duration `json:"handshake_timeout,advanced"`
	// TLSDir is the directory holding ca.crt and NAME.crt/NAME.key (kvmesh ca) that LoadTLS
	// reads TLS from. New does no I/O and reads only TLS.
	TLSDir string `json:"tls_dir"`
	// DevCADir is the directory of the development CA that LoadDevTLS reads TLS from, shared by
	// the --insecure-dev nodes of one host (transport.DevTLS); empty, the default, is
	// transport.DefaultDevCADir.
	DevCADir string `json:"dev_ca_dir,advanced"`
	// TLSCert and TLSKey are PEM files of the certificate and key the client API (HTTPAddr)
	// serves HTTPS with; empty, the default, serves plain HTTP. Both or neither. Start reads
	// them; a change to either file is picked up at the next TLS handshake, and a new pair that
	// does not load leaves the last good one in use (logged as an error).
	TLSCert string `json:"tls_cert"`
	TLSKey  string `json:"tls_key"`
	// AdvertiseHost is the address peers use to reach this node's HTTP and QUIC ports
	// (default: the gossip advertise address, else the bound host, else 127.0.0.1).
	AdvertiseHost string `json:"advertise_host"`
	// SpeculativeTTL is how long a forwarded prompt counts as cached on its owner before the
	// owner's own summary confirms it. Default 5s: long enough to cover gossip's delivery of
	// the owner's own summary (about a second).
	SpeculativeTTL time.Duration `json:"speculative_ttl,advanced"`

	// Policy names the routing policy (route.PolicyNames; default route.PolicyKvmesh); Route
	// configures it (file section "route").
	Policy string       `json:"policy,advanced"`
	Route  route.Config `json:"-"`
	// Admit configures admission; its ModelInfo is set by the node from the mesh. File section
	// "admission".
	Admit admit.Config `json:"-"`
	// Admission is the admission mode: "kvmesh" (the default: every layer, the waiting room),
	// "none" (validate and budget only: everything else runs at once and queues inside the
	// engine, like a plain router) or "queue-cap" (as none, but 429 once the chosen engine has
	// QueueCap requests waiting, like an engine's fixed queue limit; default 64). The last two
	// exist for comparison.
	Admission string `json:"admission_mode,advanced"`
	QueueCap  int    `json:"queue_cap,advanced"`
	// RoomTick is the waiting room's dispatch interval when nothing else wakes it. Default 5ms.
	RoomTick time.Duration `json:"room_tick,advanced"`
	// RetryAfter is the Retry-After of a refusal that has no better estimate (no capacity,
	// draining, a lost race for KV room). Default 1s.
	RetryAfter time.Duration `json:"retry_after,advanced"`
	// ForwardAttempts is how many candidates one dispatch tries before the request goes back
	// to the waiting room, and how many failed attempts (an owner unreachable, or its engine
	// failing before the first token) a request may meet in all before it ends with a 502.
	// Default 3.
	ForwardAttempts int `json:"forward_attempts"`
	// Migrations is how many times one request may move to another node when its owner fails
	// mid-response (its QUIC stream breaks after the first token), or its owner's engine does
	// (the ingress's own included), while the client is still connected: the ingress sends the
	// rest of the request, as a continuation of the text already streamed, to the next
	// candidate. Default 1; negative (-1) turns migration off.
	Migrations int `json:"migrations,advanced"`
	// APIKeysFile holds the API keys (admit.ParseKeys format), reloaded with the config file
	// (Reload, ConfigWatch); empty, the default, means open.
	APIKeysFile string `json:"api_keys_file"`
	// AgentFromUser takes the agent id from the OpenAI "user" field when X-Kvmesh-Agent is absent.
	AgentFromUser bool `json:"agent_from_user"`
	// MaxAgentIDBytes is the longest agent id accepted (400 above it). Default 256.
	MaxAgentIDBytes int `json:"max_agent_id_bytes,advanced"`
	// Agents turns on agent-level admission (a window of active agents per home node, see
	// package admit/agent); nil, the default, leaves it off. AgentInterval is its control
	// interval (default DefaultAgentInterval). AgentLeaseIntervals is how many intervals a step
	// held for this node's window may go without its ingress renewing the hold before the
	// window gives its place up (default 5). File section "agents".
	Agents              *agent.Config `json:"-"`
	AgentInterval       time.Duration `json:"-"`
	AgentLeaseIntervals int           `json:"-"`

	// GPU is the telemetry source: auto (the default: NVML when the driver loads, else none),
	// nvml, none or sim.
	GPU string `json:"gpu"`
	// Carbon turns on the grid carbon signal and shedding; nil, the default, means off. File
	// section "carbon".
	Carbon *CarbonConfig `json:"-"`
	// MaxBodyBytes caps a request body (413 above it). Default 4 MiB: a full 128k-token
	// context is 512 KiB of text, and JSON escaping can double it.
	MaxBodyBytes int64 `json:"max_body_bytes,advanced"`
	// DrainDelay is how long Shutdown keeps serving, new requests included, with /readyz at
	// 503 and peers told the engine is unhealthy, before it stops accepting: the time a load
	// balancer takes to see the node unready and stop sending it work. Default 5s; negative
	// means none.
	DrainDelay time.Duration `json:"drain_delay,advanced"`
	// DrainTimeout bounds how long Shutdown then waits for in-flight requests. Default 30s.
	DrainTimeout time.Duration `json:"drain_timeout,advanced"`
	// BodyTimeout bounds reading one request, headers and body, from its first byte (408
	// body_timeout past it), so a client that trickles its body cannot hold a connection and a
	// handler indefinitely; it does not bound the response. Default 30s.
	BodyTimeout time.Duration `json:"body_timeout,advanced"`
	// IdleTimeout closes a client connection idle this long between requests. Default 120s.
	IdleTimeout time.Duration `json:"idle_timeout,advanced"`
	// ConfigFile is the config file the settings were read from (ReadConfigFile sets it);
	// Reload reads it again. Empty: there is none, and a reload reads the API key file alone.
	ConfigFile string `json:"-"`
	// ConfigWatch is how often the config file and the API key file are checked for a change
	// of content, which reloads them (Reload). Default 2s; negative (-1) turns the check off,
	// leaving Reload (kvmesh node: SIGHUP).
	ConfigWatch time.Duration `json:"-"`
	// Overrides, when set, is applied to each reloaded config before it is checked and used:
	// kvmesh node applies its flags and environment variables there again, so that they keep
	// winning over the file.
	Overrides func(*Config) error `json:"-"`
	// fileSum is the hex SHA-256 of ConfigFile's content as ReadConfigFile read it (FileSum).
	fileSum string

	// OTLPEndpoint turns tracing on: the node's spans go over OTLP/HTTP to this collector,
	// host:port (plain HTTP, path /v1/traces) or an http:// or https:// URL (package
	// node/tracing). Empty, the default, leaves tracing off: no span is recorded, and a
	// client's own traceparent alone is passed on, to the owner and to an external engine.
	OTLPEndpoint string `json:"otlp_endpoint"`
	// TraceSample is the share of new traces sampled, at most 1 (default 1); a request whose
	// client sent a traceparent follows the client's decision. -1 (any negative value) samples
	// no new trace, only those the clients sampled.
	TraceSample float64 `json:"trace_sample"`
	// TracerProvider, when set, receives the node's spans in place of OTLPEndpoint's pipeline
	// (a test's in-memory exporter); the node does not shut it down.
	TracerProvider trace.TracerProvider `json:"-"`
	// Logger receives one line per event; nil discards.
	Logger *slog.Logger `json:"-"`
	// Registry collects the node's metrics and is served on /metrics; nil makes a new one.
	Registry *prometheus.Registry `json:"-"`
}

// CarbonConfig turns on the grid carbon signal: a provider polled by the node and the
// tracker's threshold, staleness and fail mode. Zero fields take DefaultCarbonConfig's values.
type CarbonConfig struct {
	Provider provider.Config `json:"provider"`
	Tracker  carbon.Config   `json:"tracker"`
	// FetchTimeout bounds one provider call. Default 10s.
	FetchTimeout time.Duration `json:"fetch_timeout,advanced"`
	// TokenFile holds the provider's credential (WattTime: user:password), which kvmesh node
	// reads into Provider when KVMESH_CARBON_TOKEN is unset. New does no I/O and reads only
	// Provider.
	TokenFile string `json:"token_file"`
}

// Admission modes.
const (
	AdmissionKvmesh   = "kvmesh"
	AdmissionNone     = "none"
	AdmissionQueueCap = "queue-cap"
)

// DefaultAgentInterval is the agent window's control interval when Config.AgentInterval is 0.
const DefaultAgentInterval = 500 * time.Millisecond

// DefaultModel is the model a node on the embedded engine serves when none is configured.
const DefaultModel = "llama-3.1-8b"

// DefaultConfig returns a node configuration for the embedded engine, every sub-config at its
// own defaults, agent admission and carbon off, and no name. Its Models is empty, since the
// default depends on the engine (see Config.Models); Fill sets it.
func DefaultConfig() Config {
	return Config{
		HTTPAddr:            ":8080",
		Engine:              "sim",
		EngineKind:          "vllm",
		ModelsInterval:      30 * time.Second,
		EngineKVBlocks:      external.DefaultConfig().NominalKVBlocks,
		EngineMaxRunning:    external.DefaultConfig().MaxRunning,
		Sim:                 sim.DefaultConfig(),
		MaxBodyBytes:        4 << 20,
		DrainDelay:          5 * time.Second,
		DrainTimeout:        30 * time.Second,
		BodyTimeout:         30 * time.Second,
		IdleTimeout:         120 * time.Second,
		Gossip:              gossip.DefaultConfig(),
		QUICAddr:            ":7443",
		HandshakeTimeout:    transport.DefaultConfig().HandshakeTimeout,
		Policy:              route.PolicyKvmesh,
		Route:               route.DefaultConfig(),
		Admit:               admit.DefaultConfig(),
		RoomTick:            5 * time.Millisecond,
		RetryAfter:          time.Second,
		ForwardAttempts:     3,
		Migrations:          1,
		Admission:           AdmissionKvmesh,
		QueueCap:            64,
		SpeculativeTTL:      5 * time.Second,
		MaxAgentIDBytes:     256,
		AgentInterval:       DefaultAgentInterval,
		AgentLeaseIntervals: 5,
		GPU:                 "auto",
		ConfigWatch:         2 * time.Second,
		AdapterLoadTimeout:  30 * time.Second,
		TraceSample:         1,
	}
}

// DefaultCarbonConfig returns the carbon defaults, with no provider chosen.
func DefaultCarbonConfig() CarbonConfig {
	return CarbonConfig{Tracker: carbon.DefaultConfig(), FetchTimeout: 10 * time.Second}
}

// Fill sets the node's own zero fields to their defaults (the zero rule). The sub-configs are
// filled by their packages' New.
func (c *Config) Fill() {
	d := DefaultConfig()
	for _, f := range []struct{ v, def *string }{
		{&c.HTTPAddr, &d.HTTPAddr}, {&c.Engine, &d.Engine}, {&c.EngineKind, &d.EngineKind}, {&c.QUICAddr, &d.QUICAddr},
		{&c.Policy, &d.Policy}, {&c.Admission, &d.Admission}, {&c.GPU, &d.GPU},
	} {
		if *f.v == "" {
			*f.v = *f.def
		}
	}
	if len(c.Models) == 0 && c.Engine == "sim" {
		c.Models = []string{DefaultModel}
	}
	if c.Engine == "sim" {
		// One role for the node and its engine: a prefill or decode role named on either
		// side is both's (mixed is the default of both).
		if route.IsMixed(c.Role) && route.IsHalf(c.Sim.Role) {
			c.Role = c.Sim.Role
		}
		if route.IsMixed(c.Sim.Role) && route.IsHalf(c.Role) {
			c.Sim.Role = c.Role
		}
		// The split rule's link and KV size are the embedded engine's unless route names them.
		if c.Route.LinkGBps == 0 {
			c.Route.LinkGBps = c.Sim.LinkGBps
		}
		if c.Route.KVBytesPerToken == 0 {
			c.Route.KVBytesPerToken = c.Sim.KVBytesPerToken
		}
	}
	for _, f := range []struct{ v, def *time.Duration }{
		{&c.DrainTimeout, &d.DrainTimeout}, {&c.RoomTick, &d.RoomTick}, {&c.RetryAfter, &d.RetryAfter},
		{&c.SpeculativeTTL, &d.SpeculativeTTL}, {&c.AgentInterval, &d.AgentInterval},
		{&c.ModelsInterval, &d.ModelsInterval}, {&c.DrainDelay, &d.DrainDelay},
		{&c.BodyTimeout, &d.BodyTimeout}, {&c.IdleTimeout, &d.IdleTimeout}, {&c.ConfigWatch, &d.ConfigWatch},
		{&c.HandshakeTimeout, &d.HandshakeTimeout}, {&c.AdapterLoadTimeout, &d.AdapterLoadTimeout},
	} {
		if *f.v == 0 {
			*f.v = *f.def
		}
	}
	for _, f := range []struct{ v, def *int }{
		{&c.QueueCap, &d.QueueCap}, {&c.ForwardAttempts, &d.ForwardAttempts}, {&c.MaxAgentIDBytes, &d.MaxAgentIDBytes},
		{&c.AgentLeaseIntervals, &d.AgentLeaseIntervals}, {&c.EngineKVBlocks, &d.EngineKVBlocks}, {&c.Migrations, &d.Migrations},
		{&c.EngineMaxRunning, &d.EngineMaxRunning},
	} {
		if *f.v == 0 {
			*f.v = *f.def
		}
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = d.MaxBodyBytes
	}
	if c.TraceSample == 0 {
		c.TraceSample = d.TraceSample
	}
	if c.Carbon != nil {
		cc := *c.Carbon // the node's own copy, not the caller's
		if cc.FetchTimeout == 0 {
			cc.FetchTimeout = DefaultCarbonConfig().FetchTimeout
		}
		c.Carbon = &cc
	}
}

// Validate checks the node's own fields, once filled (Fill).
func (c *Config) Validate() error {
	switch c.Admission {
	case AdmissionKvmesh, AdmissionNone, AdmissionQueueCap:
	default:
		return fmt.Errorf("node: admission mode %q: want %s, %s or %s", c.Admission, AdmissionKvmesh, AdmissionNone, AdmissionQueueCap)
	}
	if c.Name == "" {
		return errors.New("node: a name is required")
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return errors.New("node: the API's TLS needs both a certificate and a key file")
	}
	switch {
	case c.Engine == "sim" && (route.IsHalf(c.Role) || route.IsHalf(c.Sim.Role)) && c.Role != c.Sim.Role:
		return fmt.Errorf("node: role %q and sim.role %q differ: the node gives its engine its own role", c.Role, c.Sim.Role)
	case c.Engine != "sim" && route.IsHalf(c.Role) && c.EngineKind != external.KindVLLM:
		// SGLang's handover (a bootstrap room, both halves sent at once) is not passed yet.
		return fmt.Errorf("node: role %q in front of an external engine needs engine_kind %s (a server with a KV connector), not %s",
			c.Role, external.KindVLLM, c.EngineKind)
	}
	if !c.Standalone && c.TLS == nil {
		return errors.New("node: a TLS configuration (cluster CA and node certificate) is required for forwarding")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"DrainTimeout", c.DrainTimeout}, {"RoomTick", c.RoomTick}, {"RetryAfter", c.RetryAfter},
		{"SpeculativeTTL", c.SpeculativeTTL}, {"AgentInterval", c.AgentInterval},
		{"ModelsInterval", c.ModelsInterval}, {"BodyTimeout", c.BodyTimeout}, {"IdleTimeout", c.IdleTimeout},
		{"HandshakeTimeout", c.HandshakeTimeout}, {"AdapterLoadTimeout", c.AdapterLoadTimeout},
	} {
		if d.v < 0 {
			return fmt.Errorf("node: %s %v is negative", d.name, d.v)
		}
	}
	for _, n := range []struct {
		name string
		v    int64
	}{
		{"QueueCap", int64(c.QueueCap)}, {"ForwardAttempts", int64(c.ForwardAttempts)}, {"MaxAgentIDBytes", int64(c.MaxAgentIDBytes)},
		{"AgentLeaseIntervals", int64(c.AgentLeaseIntervals)}, {"MaxBodyBytes", c.MaxBodyBytes},
		{"EngineKVBlocks", int64(c.EngineKVBlocks)}, {"EngineMaxRunning", int64(c.EngineMaxRunning)}, {"AdapterMaxLoaded", int64(c.AdapterMaxLoaded)},
	} {
		if n.v < 0 {
			return fmt.Errorf("node: %s %d is negative", n.name, n.v)
		}
	}
	if most := transport.MaxAgentIDBytes - agent.ScopeBytes; c.MaxAgentIDBytes > most {
		// A longer id passes the 400 check and then no forward could carry it, scoped.
		return fmt.Errorf("node: MaxAgentIDBytes %d: at most %d", c.MaxAgentIDBytes, most)
	}
	if !(c.TraceSample <= 1) { // NaN too
		return fmt.Errorf("node: TraceSample %v: want at most 1", c.TraceSample)
	}
	if c.OTLPEndpoint != "" {
		if err := tracing.CheckEndpoint(c.OTLPEndpoint); err != nil {
			return fmt.Errorf("node: %w", err)
		}
	}
	if c.Carbon != nil && c.Carbon.FetchTimeout < 0 {
		return fmt.Errorf("node: carbon FetchTimeout %v is negative", c.Carbon.FetchTimeout)
	}
	return nil
}
