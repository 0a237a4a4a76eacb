package node

import (
	"context"
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
	"go.opentelemetry.io/otel/trace"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/plan"
	"github.com/kvmesh/kvmesh/carbon"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node/engine"
	extengine "github.com/kvmesh/kvmesh/node/engine/openai"
	"github.com/kvmesh/kvmesh/node/engine/sim"
	"github.com/kvmesh/kvmesh/node/gpu"
	"github.com/kvmesh/kvmesh/node/transport"
)

// Node is one kvmesh node.
type Node struct {
	cfg     Config
	log     *slog.Logger
	reg     *prometheus.Registry
	m       *metrics
	eng     engine.Engine
	sim     *sim.Sim          // the embedded engine, when it is the engine
	ext     *extengine.Engine // the external engine, when it is the engine
	httpSrv *http.Server
	tracer  trace.Tracer             // a no-op one with tracing off (trace.go)
	tp      *sdktrace.TracerProvider // the OTLP pipeline Start built, if any

	g        *gossip.Gossip
	tr       *transport.Transport
	planner  *plan.Planner
	adm      *admit.Admitter
	agents   *agentGate // nil: agent admission off
	roomKick chan struct{}
	gpu      *gpu.Sampler
	carbon   *carbon.Tracker

	carbonProvider carbon.Provider
	tok            *kvindex.Calibration               // prompt bytes per token by model (tokens.go)
	meshTok        atomic.Pointer[map[string]float64] // the peers' published figures, by model (updateMeshTokens)
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

// New fills cfg's zero fields with their defaults (see Config), validates it and builds a
// node. It does no I/O.
func New(cfg Config) (*Node, error) {
	cfg.fill()
	if err := cfg.validate(); err != nil {
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
	n := &Node{cfg: cfg, log: log, reg: reg, m: newMetrics(reg), tok: newTokenCalibration(),
		done: make(chan struct{}), roomKick: make(chan struct{}, 1)}
	n.buildTracer()
	if err := n.buildEngine(); err != nil {
		return nil, err
	}
	if err := n.buildMesh(); err != nil {
		closeEngine(n.eng)
		return nil, err
	}
	n.httpSrv = &http.Server{
		Handler:           n.counted(n.routes()),
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
		// The engine reports exactly what it caches and evicts; gossip spreads it.
		sc.OnPrefix = n.onPrefix
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
	ec.ModelsInterval = n.cfg.ModelsInterval
	// The engine's max_model_len is a model's context; when the engine sends none, the
	// admission config's context_tokens for it, else the engine package's default.
	for _, name := range n.cfg.Models {
		ec.Models = append(ec.Models, engine.Model{Name: name, ContextTokens: n.cfg.Admit.Models[name].ContextTokens})
	}
	ec.Registerer = n.reg
	ec.Logger = n.log
	ec.NominalKVBlocks = n.cfg.EngineKVBlocks
	ec.Priority = n.cfg.EnginePriority
	// The engine's residency model says what the server caches; gossip spreads it as the
	// embedded engine's exact report.
	ec.OnPrefix = n.onPrefix
	e, err := extengine.New(ec)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	n.ext, n.eng = e, e
	return nil
}

// onPrefix hands the engine's stored and evicted prefix blocks to gossip. n.g is set before
// the engine runs anything (New builds it, Start starts both); a standalone node has none.
func (n *Node) onPrefix(stored, evicted []uint64) {
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

// Start binds the listeners, joins the mesh and starts serving. It returns once the node
// accepts requests; ctx bounds starting up, not the node's life (Shutdown ends that).
func (n *Node) Start(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.started {
		return errors.New("node: already started")
	}
	if err := n.startTracing(); err != nil {
		return err
	}
	if n.ext != nil {
		// An engine that does not answer yet leaves the node unready, not stopped; one that
		// answers without a configured model stops it.
		if err := n.ext.Start(ctx); err != nil {
			return fmt.Errorf("node: engine: %w", err)
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
	errs = append(errs, n.stopTracing(ctx)) // the last spans, the drain's included
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
