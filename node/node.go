package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/agent"
	"github.com/kvmesh/kvmesh/admit/plan"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/carbon"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node/engine"
	extengine "github.com/kvmesh/kvmesh/node/engine/openai"
	"github.com/kvmesh/kvmesh/node/engine/sim"
	"github.com/kvmesh/kvmesh/node/gpu"
	"github.com/kvmesh/kvmesh/node/transport"
)

// Config configures one node. Zero fields take DefaultConfig's values.
type Config struct {
	// Name identifies the node in the mesh and in X-Kvmesh-Node. Default: the host name.
	Name string
	// HTTPAddr is the API's listen address (default ":8080"); port 0 picks a free port.
	HTTPAddr string
	// Engine is "sim" (the embedded simulated engine) or the base URL of an external
	// OpenAI-compatible engine, whose metric names EngineKind selects.
	Engine     string
	EngineKind string
	// Models lists the model names served. With the sim engine each gets SimContextTokens.
	Models []string
	// Sim configures the embedded engine (its Models, OnPrefix and Registerer are set by the node).
	Sim sim.Config
	// Standalone serves the engine alone: no gossip, no forwarding (kvmesh engine).
	Standalone bool
	// Role is the node's pool role ("" serves both prefill and decode).
	Role string

	// Gossip configures the mesh member (Name, Logger and Registerer are the node's).
	Gossip gossip.Config
	// QUICAddr is the UDP listen address for peer forwarding (default ":7443") and TLS the
	// cluster's mTLS configuration (transport.LoadTLS); both are required outside Standalone.
	QUICAddr string
	TLS      *tls.Config
	// AdvertiseHost is the address peers use to reach this node's HTTP and QUIC ports
	// (default: the gossip advertise address, else the bound host, else 127.0.0.1).
	AdvertiseHost string
	// SpeculativeTTL is how long a forwarded prompt counts as cached on its owner before the
	// owner's own summary confirms it.
	SpeculativeTTL time.Duration

	// Policy names the routing policy (route.PolicyNames); Route configures it.
	Policy string
	Route  route.Config
	// Admit configures admission; its ModelInfo is set by the node from the mesh.
	Admit admit.Config
	// Admission is the admission mode: "kvmesh" (every layer, the waiting room), "none"
	// (validate and budget only: everything else runs at once and queues inside the engine,
	// like a plain router) or "queue-cap" (as none, but 429 once the chosen engine has QueueCap
	// requests waiting, like an engine's fixed queue limit). The last two exist for comparison.
	Admission string
	QueueCap  int
	// RoomTick is the waiting room's dispatch interval when nothing else wakes it.
	RoomTick time.Duration
	// APIKeysFile holds the API keys (admit.ParseKeys format), hot-reloaded; empty means open.
	APIKeysFile string
	// AgentFromUser takes the agent id from the OpenAI "user" field when X-Kvmesh-Agent is absent.
	AgentFromUser bool
	// Agents turns on agent-level admission (a window of active agents per home node, see
	// package admit/agent); nil leaves it off. AgentInterval is its control interval
	// (default DefaultAgentInterval).
	Agents        *agent.Config
	AgentInterval time.Duration

	// GPU is the telemetry source: auto (NVML when the driver loads, else none), nvml, none or sim.
	GPU string
	// Carbon turns on the grid carbon signal and shedding; nil means off.
	Carbon *CarbonConfig
	// MaxBodyBytes caps a request body (413 above it).
	MaxBodyBytes int64
	// DrainTimeout bounds how long Shutdown waits for in-flight requests.
	DrainTimeout time.Duration
	// Logger receives one line per event; nil discards.
	Logger *slog.Logger
	// Registry collects the node's metrics and is served on /metrics; nil makes a new one.
	Registry *prometheus.Registry
}

// Admission modes.
const (
	AdmissionKvmesh   = "kvmesh"
	AdmissionNone     = "none"
	AdmissionQueueCap = "queue-cap"
)

// DefaultModel is the model a node serves when none is configured.
const DefaultModel = "llama-3.1-8b"

// DefaultConfig returns a node configuration for the embedded engine.
func DefaultConfig() Config {
	return Config{
		HTTPAddr:     ":8080",
		Engine:       "sim",
		EngineKind:   "vllm",
		Models:       []string{DefaultModel},
		Sim:          sim.DefaultConfig(),
		MaxBodyBytes: 4 << 20, // a full 128k-token context is 512 KiB of text; JSON escaping can double it
		DrainTimeout: 30 * time.Second,
		Gossip:       gossip.DefaultConfig(),
		QUICAddr:     ":7443",
		Policy:       route.PolicyKvmesh,
		Route:        route.DefaultConfig(),
		Admit:        admit.DefaultConfig(),
		RoomTick:     5 * time.Millisecond,
		Admission:    AdmissionKvmesh,
		QueueCap:     64,
		// Long enough to cover gossip's delivery of the owner's own summary (about a second).
		SpeculativeTTL: 5 * time.Second,
		GPU:            "auto",
	}
}

// Node is one kvmesh node.
type Node struct {
	cfg     Config
	log     *slog.Logger
	reg     *prometheus.Registry
	m       *metrics
	eng     engine.Engine
	sim     *sim.Sim          // the embedded engine, when it is the engine
	ext     *extengine.Engine // the external engine, when it is the engine
	models  map[string]engine.Model
	httpSrv *http.Server

	g        *gossip.Gossip
	tr       *transport.Transport
	planner  *plan.Planner
	adm      *admit.Admitter
	agents   *agentGate // nil: agent admission off
	roomKick chan struct{}
	gpu      *gpu.Sampler
	carbon   *carbon.Tracker

	carbonProvider carbon.Provider
	inFlightTokens atomic.Int64
	advertiseHTTP  string
	advertiseQUIC  string
	bgCancel       context.CancelFunc
	bg             sync.WaitGroup
	forwarded      atomic.Int64 // requests peers forwarded here, in flight
	serving        atomic.Int64 // HTTP requests in their handlers

	mu       sync.Mutex
	ln       net.Listener
	started  bool
	draining atomic.Bool // set once Shutdown begins
	closed   bool
	done     chan struct{}
}

// New validates cfg and builds a node. It does no I/O.
func New(cfg Config) (*Node, error) {
	def := DefaultConfig()
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = def.HTTPAddr
	}
	if cfg.Engine == "" {
		cfg.Engine = def.Engine
	}
	if cfg.EngineKind == "" {
		cfg.EngineKind = def.EngineKind
	}
	if len(cfg.Models) == 0 && cfg.Engine == "sim" {
		cfg.Models = def.Models
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = def.MaxBodyBytes
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = def.DrainTimeout
	}
	if cfg.QUICAddr == "" {
		cfg.QUICAddr = def.QUICAddr
	}
	if cfg.Policy == "" {
		cfg.Policy = def.Policy
	}
	switch cfg.Admission {
	case "":
		cfg.Admission = AdmissionKvmesh
	case AdmissionKvmesh, AdmissionNone, AdmissionQueueCap:
	default:
		return nil, fmt.Errorf("node: admission mode %q: want %s, %s or %s", cfg.Admission, AdmissionKvmesh, AdmissionNone, AdmissionQueueCap)
	}
	if cfg.QueueCap <= 0 {
		cfg.QueueCap = def.QueueCap
	}
	if cfg.RoomTick <= 0 {
		cfg.RoomTick = def.RoomTick
	}
	if cfg.SpeculativeTTL <= 0 {
		cfg.SpeculativeTTL = def.SpeculativeTTL
	}
	if cfg.Name == "" {
		return nil, errors.New("node: a name is required")
	}
	if !cfg.Standalone && cfg.TLS == nil {
		return nil, errors.New("node: a TLS configuration (cluster CA and node certificate) is required for forwarding")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("node", cfg.Name)
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	n := &Node{cfg: cfg, log: log, reg: reg, m: newMetrics(reg), models: map[string]engine.Model{},
		done: make(chan struct{}), roomKick: make(chan struct{}, 1)}
	if err := n.buildEngine(); err != nil {
		return nil, err
	}
	for _, m := range n.eng.Models() {
		n.models[m.Name] = m
	}
	if err := n.buildMesh(); err != nil {
		closeEngine(n.eng)
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", n.handleGenerate(engine.Chat))
	mux.HandleFunc("POST /v1/completions", n.handleGenerate(engine.Completion))
	mux.HandleFunc("GET /v1/models", n.handleModels)
	mux.HandleFunc("GET /healthz", n.handleHealthz)
	mux.HandleFunc("GET /readyz", n.handleReadyz)
	mux.HandleFunc("GET /v1/mesh/peers", n.handlePeers)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/", n.handleNotFound)
	n.httpSrv = &http.Server{
		Handler:           n.counted(mux),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	return n, nil
}

func (n *Node) buildEngine() error {
	if n.cfg.Engine == "sim" {
		sc := n.cfg.Sim
		if sc.BlockTokens == 0 {
			sc.BlockTokens = kvindex.DefaultBlockTokens
		}
		sc.Models = sc.Models[:0:0]
		ctxTokens := sim.DefaultConfig().Models[0].ContextTokens
		for _, name := range n.cfg.Models {
			sc.Models = append(sc.Models, engine.Model{Name: name, ContextTokens: ctxTokens})
		}
		sc.Registerer = n.reg
		sc.Logger = n.log
		// The engine reports exactly what it caches and evicts; gossip spreads it. n.g is set
		// before the engine runs anything (New builds it, Start starts both).
		sc.OnPrefix = func(stored, evicted []uint64) {
			if n.g == nil {
				return
			}
			if len(stored) > 0 {
				n.g.PrefixStored(stored)
			}
			if len(evicted) > 0 {
				n.g.PrefixEvicted(evicted)
			}
		}
		s, err := sim.New(sc)
		if err != nil {
			return fmt.Errorf("node: %w", err)
		}
		n.sim, n.eng = s, s
		return nil
	}
	ec := extengine.DefaultConfig()
	ec.BaseURL = n.cfg.Engine
	ec.Kind = n.cfg.EngineKind
	for _, name := range n.cfg.Models {
		ec.Models = append(ec.Models, engine.Model{Name: name, ContextTokens: sim.DefaultConfig().Models[0].ContextTokens})
	}
	ec.Registerer = n.reg
	ec.Logger = n.log
	e, err := extengine.New(ec)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	n.ext, n.eng = e, e
	return nil
}

// Start binds the listeners, joins the mesh and starts serving. It returns once the node
// accepts requests; ctx bounds starting up, not the node's life (Shutdown ends that).
func (n *Node) Start(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.started {
		return errors.New("node: already started")
	}
	if n.ext != nil {
		if err := n.ext.Start(ctx); err != nil {
			return fmt.Errorf("node: engine: %w", err)
		}
		for _, m := range n.eng.Models() {
			n.models[m.Name] = m
		}
	}
	ln, err := net.Listen("tcp", n.cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("node: listen http: %w", err)
	}
	n.ln = ln
	n.started = true
	n.advertiseHTTP = n.advertise(ln.Addr())
	if err := n.startMesh(ctx); err != nil {
		return err
	}
	go func() {
		if err := n.httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error("http server stopped", "err", err)
		}
	}()
	n.log.Info("serving", "http", ln.Addr().String(), "quic", n.advertiseQUIC, "engine", n.cfg.Engine, "version", Version)
	return nil
}

// HTTPAddr is the bound API address (valid after Start).
func (n *Node) HTTPAddr() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ln == nil {
		return ""
	}
	return n.ln.Addr().String()
}

// Name is the node's name in the mesh.
func (n *Node) Name() string { return n.cfg.Name }

// Registry is the node's metric registry.
func (n *Node) Registry() *prometheus.Registry { return n.reg }

// Shutdown stops accepting requests, waits up to the drain timeout (or ctx) for in-flight ones,
// then closes the engine and everything else. It is safe to call more than once.
func (n *Node) Shutdown(ctx context.Context) error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		<-n.done
		return nil
	}
	n.closed = true
	n.draining.Store(true)
	started := n.started
	n.mu.Unlock()
	defer close(n.done)

	var errs []error
	if started {
		// Peers see EngineHealthy false in the next record and stop sending work; new client
		// connections are refused while in-flight requests, local and forwarded, finish.
		dctx, cancel := context.WithTimeout(ctx, n.cfg.DrainTimeout)
		// httpSrv.Shutdown closes the listener and the idle connections and waits for the
		// rest, but it counts a connection that never sent a request as busy for 5 s (HTTP
		// clients dial spares), so the drain ends when no request, local or forwarded, is in
		// flight, whatever such connections do.
		quiet, stop := context.WithCancel(dctx)
		go func() {
			if n.waitIdle(quiet) == nil {
				stop()
			}
		}()
		_ = n.httpSrv.Shutdown(quiet)
		stop()
		err := n.waitIdle(dctx)
		cancel()
		// Unused connections close now; past the deadline, so do the stragglers, whose
		// streams end with an error.
		_ = n.httpSrv.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("node: drain: %w", err))
		}
		errs = append(errs, n.stopMesh())
	}
	errs = append(errs, closeEngine(n.eng))
	n.log.Info("stopped")
	return errors.Join(errs...)
}

func closeEngine(e engine.Engine) error {
	if c, ok := e.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// waitIdle waits until no request is in flight, neither in an HTTP handler nor forwarded here
// by a peer, or for ctx.
func (n *Node) waitIdle(ctx context.Context) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for n.serving.Load() > 0 || n.forwarded.Load() > 0 {
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// counted counts the requests in h's handlers, which the drain waits for.
func (n *Node) counted(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.serving.Add(1)
		defer n.serving.Add(-1)
		h.ServeHTTP(w, r)
	})
}
