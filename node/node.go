package node

import (
	"cmp"
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
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/plan"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/carbon"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node/adapters"
	"github.com/kvmesh/kvmesh/node/agentgate"
	"github.com/kvmesh/kvmesh/node/api"
	"github.com/kvmesh/kvmesh/node/apicert"
	"github.com/kvmesh/kvmesh/node/console"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/engine/external"
	"github.com/kvmesh/kvmesh/node/engine/kvevents"
	"github.com/kvmesh/kvmesh/node/engine/sim"
	"github.com/kvmesh/kvmesh/node/gpu"
	"github.com/kvmesh/kvmesh/node/grid"
	"github.com/kvmesh/kvmesh/node/journey"
	"github.com/kvmesh/kvmesh/node/kvconnector"
	"github.com/kvmesh/kvmesh/node/meshview"
	"github.com/kvmesh/kvmesh/node/metrics"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/tracing"
	"github.com/kvmesh/kvmesh/node/transport"
)

// Node is one kvmesh node.
type Node struct {
	cfg   Config
	log   *slog.Logger
	reg   *prometheus.Registry
	m     *metrics.Metrics
	eng   engine.Engine
	sim   *sim.Sim            // the embedded engine, when it is the engine
	ext   *external.Engine    // the external engine, when it is the engine
	kvpub *kvevents.Publisher // the embedded engine's KV events, with PublishKVEvents
	kv    *kvconnector.Store  // kvmesh engine's handovers and pulls (node/api serves them)
	// adapters are the adapter source's LoRA adapters, loaded on demand (node/adapters); Start
	// reads the source.
	adapters *adapters.Set
	// kvBlockTokens is the embedded engine's block size, for its published events.
	kvBlockTokens int
	httpSrv       *http.Server
	admSrv        *http.Server             // the admin listener's, when Config.AdminAddr is set
	spans         tracing.Spans            // on a no-op tracer with tracing off (trace.go)
	tp            *sdktrace.TracerProvider // the OTLP pipeline Start built, if any

	g       *gossip.Gossip
	mesh    meshview.Mesh // the mesh as routing and the API read it; set by New
	tr      *transport.Transport
	planner *plan.Planner
	eject   *route.Ejector // peers whose forwards fail at the transport, out of routing for a while
	retries *route.RetryBudget
	adm     *admit.Admitter
	x       *journey.Executor // performs the request's steps (node/journey)
	api     *api.Server       // the HTTP API's handlers (node/api)
	// ratedPools are the waiting room pools given a prefill rate at the last update
	// (updatePrefillRates; the room loop's alone).
	ratedPools map[meshview.PoolKey]float64
	agents     *agentgate.Gate // nil: agent admission off
	gpu        *gpu.Sampler
	carbon     *carbon.Tracker // grid's tracker; nil: the carbon signal is off
	grid       *grid.Grid
	console    *console.Console // nil: Config.NoConsole

	tokens *meshview.Tokens // a prompt's tokens by model: learned here, else the mesh's figures
	// claims is the KV room the waiting room's blocked heads hold, as the last room pass left
	// it (publishClaims): published in this node's record, counted by every peer (claims.go).
	claims atomic.Pointer[[]gossip.Claim]
	// Test hooks (export_test.go): KV blocks reported used beyond the engine's, in the state
	// record and the owner's check (testKVHeld), or in the owner's check alone (testKVOwnerHeld).
	testKVHeld, testKVOwnerHeld atomic.Int64
	advertiseHTTP               string
	advertiseQUIC               string
	bgCancel                    context.CancelFunc
	bg                          sync.WaitGroup
	forwarded                   atomic.Int64 // requests peers forwarded here, in flight
	serving                     atomic.Int64 // HTTP requests in their handlers

	// Reloads (reload.go) take turns under reloadMu, which guards the fields after it.
	reloadMu  sync.Mutex
	applied   Config                 // the settings last loaded: the file's, flags over it
	configSum string                 // hash of the config file's content as last read
	keysSum   string                 // the same of the API key file
	missing   map[string]bool        // the watched files found gone, by path, until they are back
	inForce   atomic.Pointer[string] // hash of the config file in force (kvmesh_config_hash_info)

	mu       sync.Mutex
	ln       net.Listener
	admLn    net.Listener
	started  bool
	serves   bool        // Start succeeded: the API is served
	unready  atomic.Bool // set once Shutdown begins: /readyz is 503, peers see the engine unhealthy
	draining atomic.Bool // set once the drain delay is over: the node takes no new work
	// requests is every API request's base context; the drain timeout cancels it
	// (journey.ErrDrainTimeout), so a request still running then ends with an explicit error.
	requests    context.Context
	endRequests context.CancelCauseFunc
	closed      bool
	done        chan struct{}
}

// New fills cfg's zero fields with their defaults (see Config), validates it and builds a
// node. It does no I/O.
func New(cfg Config) (*Node, error) {
	cfg.Fill()
	if err := cfg.Validate(); err != nil {
		return nil, err
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
	n := &Node{cfg: cfg, log: log, reg: reg, m: metrics.New(reg, cfg.Admit.WithDefaults().SLO, Version), tokens: meshview.NewTokens(),
		done: make(chan struct{}), applied: cfg, configSum: cfg.FileSum()}
	hash := cmp.Or(cfg.FileSum(), noConfigFile)
	n.inForce.Store(&hash)
	n.requests, n.endRequests = context.WithCancelCause(context.Background())
	n.m.Reloaded.SetToCurrentTime()
	n.buildTracer()
	if err := n.buildEngine(); err != nil {
		return nil, err
	}
	n.adapters = adapters.New(adapters.Deps{
		Config: adapters.Config{Name: cfg.Name, Source: cfg.AdapterSource, LoadTimeout: cfg.AdapterLoadTimeout, MaxLoaded: cfg.AdapterMaxLoaded},
		Engine: n.eng, Runtime: n.ext, Sim: n.sim, Metrics: metrics.NewAdapters(reg), Spans: &n.spans, Log: log, Served: n.servedInMesh,
	})
	if err := n.buildMesh(); err != nil {
		closeEngine(n.eng)
		return nil, err
	}
	n.mesh = n.meshView()
	if err := n.buildConsole(); err != nil {
		closeEngine(n.eng)
		return nil, err
	}
	var err error
	if n.x, err = n.newExecutor(); err != nil {
		closeEngine(n.eng)
		return nil, err
	}
	if n.api, err = n.newAPI(); err != nil {
		closeEngine(n.eng)
		return nil, err
	}
	n.httpSrv = &http.Server{
		Handler:     n.counted(n.routes()),
		BaseContext: func(net.Listener) context.Context { return n.requests },
		// Headers come within 10 s (or the body timeout, when shorter); Go's server closes a
		// connection whose headers are late without an answer, as it never read a request.
		ReadHeaderTimeout: min(10*time.Second, cfg.BodyTimeout),
		// ReadTimeout bounds the headers and the body alone: the server lifts the deadline
		// once the body has been read, so a long stream back is not cut.
		ReadTimeout: cfg.BodyTimeout,
		IdleTimeout: cfg.IdleTimeout,
		ErrorLog:    slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	if cfg.AdminAddr != "" {
		n.admSrv = &http.Server{
			Handler:           n.adminHandler(),
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          n.httpSrv.ErrorLog,
		}
	}
	return n, nil
}

func (n *Node) buildEngine() error {
	if n.cfg.Engine == "sim" {
		if n.cfg.EngineKVEvents != "" {
			return errors.New("node: engine_kv_events reads an external engine's KV events; the embedded engine reports its cache itself")
		}
		if m := n.cfg.EngineMessages; m != "" && m != external.MessagesAuto && m != external.MessagesOff {
			return errors.New("node: engine_messages is an external engine's; the embedded engine runs Messages requests translated to chat")
		}
		sc := n.cfg.Sim
		if sc.BlockTokens == 0 {
			sc.BlockTokens = kvindex.DefaultBlockTokens
		}
		sc.Models = sc.Models[:0:0]
		ctxTokens := sim.DefaultConfig().Models[0].ContextTokens
		for _, name := range n.cfg.Models {
			sc.Models = append(sc.Models, engine.Model{Name: name, ContextTokens: ctxTokens})
		}
		if n.cfg.Standalone {
			// kvmesh engine's /metrics carries vLLM's names, for the node in front of it (and
			// any scraper built for vLLM) to read. A node's own /metrics keeps to kvmesh_*
			// names, which pass Prometheus's linter: the engine's load is in stateCollector.
			sc.Registerer = n.reg
		}
		sc.Logger = n.log
		// The engine reports exactly what it caches and evicts; gossip spreads it.
		sc.OnPrefix = n.onPrefix
		s, err := sim.New(sc)
		if err != nil {
			return fmt.Errorf("node: %w", err)
		}
		n.sim, n.eng = s, s
		if n.cfg.Standalone {
			n.kv = kvconnector.New(n.cfg.Name)
		}
		return n.buildKVPublisher(sc.BlockTokens)
	}
	if n.cfg.PublishKVEvents != "" {
		return errors.New("node: only the embedded engine publishes KV events (an external engine publishes its own)")
	}
	ec := external.DefaultConfig()
	ec.BaseURL = n.cfg.Engine
	ec.Kind = n.cfg.EngineKind
	ec.ModelsInterval = n.cfg.ModelsInterval
	// The engine's max_model_len is a model's context; when the engine sends none, the
	// admission config's context_tokens for it, else the engine package's default.
	for _, name := range n.cfg.Models {
		ec.Models = append(ec.Models, engine.Model{Name: name, ContextTokens: n.cfg.Admit.Models[name].ContextTokens})
	}
	ec.Registerer = n.reg
	ec.Logger = n.log
	ec.NominalKVBlocks = n.cfg.EngineKVBlocks
	ec.MaxRunning = n.cfg.EngineMaxRunning
	ec.Priority = n.cfg.EnginePriority
	ec.KVEvents = n.cfg.EngineKVEvents
	ec.Messages = n.cfg.EngineMessages
	// The engine's residency model says what the server caches; gossip spreads it as the
	// embedded engine's exact report.
	ec.OnPrefix = n.onPrefix
	e, err := external.New(ec)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	n.ext, n.eng = e, e
	return nil
}

// onPrefix hands the engine's stored and evicted prefix blocks to the KV events publisher, and
// their anchors (kvindex.Anchor) to gossip: routing matches by anchors, so no other block need
// cross the mesh. n.g is set before the engine runs anything (New builds it, Start starts
// both); a standalone node has none.
func (n *Node) onPrefix(d kvindex.CacheDelta) {
	n.publishKV(d.Stored, d.Evicted)
	if n.g == nil {
		return
	}
	if len(d.StoredAnchors) > 0 {
		n.g.PrefixStored(d.StoredAnchors)
	}
	if len(d.EvictedAnchors) > 0 {
		n.g.PrefixEvicted(d.EvictedAnchors)
	}
}

// Start binds the listeners, joins the mesh and starts serving. It returns once the node
// accepts requests; ctx bounds starting up, not the node's life (Shutdown ends that).
func (n *Node) Start(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.started {
		return errors.New("node: already started")
	}
	serve := n.httpSrv.Serve
	if n.cfg.TLSCert != "" {
		r, err := apicert.Load(n.cfg.TLSCert, n.cfg.TLSKey, n.log)
		if err != nil {
			return fmt.Errorf("node: %w", err)
		}
		n.httpSrv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.GetCertificate}
		serve = func(ln net.Listener) error { return n.httpSrv.ServeTLS(ln, "", "") }
	}
	if err := n.startTracing(); err != nil {
		return err
	}
	if err := n.adapters.Start(); err != nil {
		return err
	}
	if n.ext != nil {
		// An engine that does not answer yet leaves the node unready, not stopped; one that
		// answers without a configured model stops it.
		if err := n.ext.Start(ctx); err != nil {
			return fmt.Errorf("node: engine: %w", err)
		}
	}
	if n.kvpub != nil {
		if err := n.kvpub.Start(); err != nil {
			return fmt.Errorf("node: kv events: %w", err)
		}
	}
	ln, err := net.Listen("tcp", n.cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("node: listen http: %w", err)
	}
	n.ln = ln
	n.started = true
	n.advertiseHTTP = n.advertise(ln.Addr())
	if n.admSrv != nil {
		if n.admLn, err = net.Listen("tcp", n.cfg.AdminAddr); err != nil {
			_ = ln.Close()
			return fmt.Errorf("node: listen admin: %w", err)
		}
	}
	if err := n.startMesh(ctx); err != nil {
		_ = ln.Close()
		if n.admLn != nil {
			_ = n.admLn.Close()
		}
		return err
	}
	n.serves = true
	n.serve(serve, ln, "http")
	admin := ""
	if n.admLn != nil {
		n.serve(n.admSrv.Serve, n.admLn, "admin")
		admin = n.admLn.Addr().String()
	}
	gossipAddr := ""
	if n.g != nil {
		gossipAddr = n.g.LocalAddr()
	}
	n.log.Info("serving", "http", ln.Addr().String(), "https", n.cfg.TLSCert != "", "admin", admin, "quic", n.advertiseQUIC, "gossip", gossipAddr, "engine", n.cfg.Engine, "version", Version)
	return nil
}

// serve runs srv on ln until it is closed.
func (n *Node) serve(serve func(net.Listener) error, ln net.Listener, name string) {
	go func() {
		if err := serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error(name+" server stopped", "err", err)
		}
	}()
}

// HTTPAddr is the bound API address (valid after Start).
func (n *Node) HTTPAddr() string { return n.boundAddr(&n.ln) }

// AdminAddr is the bound admin address (valid after Start; "" without Config.AdminAddr).
func (n *Node) AdminAddr() string { return n.boundAddr(&n.admLn) }

// boundAddr is the address of the listener *ln, "" while there is none.
func (n *Node) boundAddr(ln *net.Listener) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if *ln == nil {
		return ""
	}
	return (*ln).Addr().String()
}

// Name is the node's name in the mesh.
func (n *Node) Name() string { return n.cfg.Name }

// Registry is the node's metric registry.
func (n *Node) Registry() *prometheus.Registry { return n.reg }

// Shutdown turns the node unready and keeps serving for the drain delay, then stops accepting
// requests, waits up to the drain timeout for in-flight ones, leaves the mesh and closes the
// engine and everything else. The end of ctx cuts the delay and the drain short. It is safe
// to call more than once.
func (n *Node) Shutdown(ctx context.Context) error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		<-n.done
		return nil
	}
	n.closed = true
	n.unready.Store(true)
	started, serves := n.started, n.serves
	n.mu.Unlock()
	defer close(n.done)

	var errs []error
	if started {
		marked := make(chan struct{})
		go func() {
			// Peers learn now that this node will leave, so they count its departure as one
			// however late the departure itself reaches them (gossip.MarkLeaving).
			defer close(marked)
			if n.g != nil && serves {
				_ = n.g.MarkLeaving(n.cfg.Gossip.LeaveTimeout)
			}
		}()
		if serves { // a node that failed to start has no one to tell
			n.deregister(ctx)
		}
		n.draining.Store(true)
		err := n.drain(ctx)
		<-marked
		errs = append(errs, err, n.stopMesh())
	}
	errs = append(errs, closeEngine(n.eng))
	if n.kvpub != nil {
		errs = append(errs, n.kvpub.Close())
	}
	errs = append(errs, n.stopTracing(ctx)) // the last spans, the drain's included
	n.log.Info("stopped")
	return errors.Join(errs...)
}

// deregister waits out the drain delay: /readyz answers 503 and the next state record tells
// peers the engine is unhealthy, so load balancers and peers stop sending work, while requests
// that still arrive are served.
func (n *Node) deregister(ctx context.Context) {
	if n.cfg.DrainDelay <= 0 {
		return
	}
	n.log.Info("unready: serving until the drain delay ends", "drain_delay", n.cfg.DrainDelay)
	t := time.NewTimer(n.cfg.DrainDelay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// counted counts the requests in h's handlers, which the drain waits for (api.Counted).
func (n *Node) counted(h http.Handler) http.Handler { return api.Counted(h, &n.serving, n.drainCut) }

// drainCut is the error of a request the drain timeout ended, when ctx (its context) says it
// did; nil otherwise (the client left, or nothing ended it).
func (n *Node) drainCut(ctx context.Context) *openai.Error {
	return journey.DrainCut(ctx, n.cfg.Name, n.cfg.DrainTimeout)
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
