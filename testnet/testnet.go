package testnet

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/transport"
)

// Config describes a testnet.
type Config struct {
	// Nodes is how many nodes to start (default 3).
	Nodes int
	// Host is the loopback address every listener binds (default 127.0.0.1).
	Host string
	// HTTPBase gives node i the HTTP port HTTPBase+i; 0 picks free ports.
	HTTPBase int
	// GossipBase gives node i the gossip port GossipBase+i, UDP and TCP; 0 picks free ports.
	GossipBase int
	// Dir holds the throwaway CA and certificates; empty means a temporary directory that
	// Close removes.
	Dir string
	// Fast shortens gossip's timers for tests (tens of milliseconds instead of LAN defaults).
	Fast bool
	// Light makes each node cheap enough for dozens to share two cores (LightNode); the
	// command turns it on above LightAbove nodes.
	Light bool
	// Configure, if set, adjusts node i's configuration before it is built.
	Configure func(i int, cfg *node.Config)
	// Engines is EnginesEmbedded (the zero value: each node runs the simulated engine in
	// process) or EnginesExternal: node i runs in front of its own standalone simulated engine
	// (what kvmesh engine serves) on a loopback port, as in front of vLLM. That engine takes
	// the node's Sim and Models as Configure left them; the node's Engine is the engine's URL,
	// its EngineKind "vllm" and its Models empty (it serves what the engine's /v1/models lists).
	Engines string
	// Roles gives node i the role Roles[i] (node.role: "mixed", "prefill" or "decode"); nodes
	// past its end, and empty entries, are mixed. With EnginesExternal a prefill or decode
	// node's engine runs in that role too, as a vLLM server with a KV connector would.
	Roles []string
	// Logger receives every node's logs; nil discards.
	Logger *slog.Logger
}

// Engine placements of Config.Engines.
const (
	EnginesEmbedded = "embedded"
	EnginesExternal = "external"
)

// Net is a running testnet.
type Net struct {
	Nodes []*node.Node
	// Engines are the standalone engines in front of which Nodes run, in the same order, with
	// EnginesExternal; empty otherwise.
	Engines []*node.Node
	tmpDir  string
	cfg     Config
	dir     string // the CA and the first nodes' certificates
	key     []byte
	seed    string // the first node's gossip address, which every other node joins
}

// LightAbove is the node count above which `kvmesh testnet` makes its nodes light.
const LightAbove = 16

// LightNode is what Config.Light changes in a node, read off what an idle node spends CPU
// on, times the node count: state records (every node receives every record, so their cost
// grows with the square of the count: one every 5 s instead of every second, on change at
// most every second, stale after 15 s), the waiting room's idle tick (20 ms instead of 5 ms),
// GPU telemetry (none: the simulated GPU's drifting figures change the record), and the
// simulated engine's KV pool (4,096 blocks unless set). Memberlist's timers, the prefix flush
// and the bandwidth budget keep their defaults: they are what a scale measurement measures.
func LightNode(nc *node.Config) {
	nc.Gossip.PublishInterval = 5 * time.Second
	nc.Gossip.MinPublishInterval = time.Second
	nc.Gossip.StaleAfter = 15 * time.Second
	nc.Route.MaxAge = nc.Gossip.StaleAfter
	nc.RoomTick = 20 * time.Millisecond
	nc.GPU = "none"
	if nc.Sim.KVBlocks == 0 {
		nc.Sim.KVBlocks = 4096
	}
}

// Name is node i's name.
func Name(i int) string { return "n" + strconv.Itoa(i+1) }

// FastGossip shortens memberlist's and kvmesh's gossip timers for loopback tests.
func FastGossip(g *gossip.Config) {
	g.ProbeInterval = 100 * time.Millisecond
	g.ProbeTimeout = 50 * time.Millisecond
	g.GossipInterval = 20 * time.Millisecond
	g.SuspicionMult = 2
	g.PushPullInterval = time.Second
	g.PublishInterval = 200 * time.Millisecond
	g.MinPublishInterval = 20 * time.Millisecond
	g.FlushInterval = 10 * time.Millisecond
	g.PrefixInterval = 20 * time.Millisecond
	g.StaleAfter = time.Second
	g.TCPTimeout = time.Second
	g.DeadNodeReclaimTime = time.Millisecond
	g.MaxBytesPerSecond = 1 << 20
}

// Start starts cfg.Nodes nodes, each joining the first, and returns once all are serving.
// It does not wait for gossip to converge: see WaitConverged.
func Start(ctx context.Context, cfg Config) (*Net, error) {
	if cfg.Nodes <= 0 {
		cfg.Nodes = 3
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	switch cfg.Engines {
	case "", EnginesEmbedded, EnginesExternal:
	default:
		return nil, fmt.Errorf("testnet: engines %q is neither %s nor %s", cfg.Engines, EnginesEmbedded, EnginesExternal)
	}
	for _, b := range []struct {
		name string
		base int
	}{{"HTTP", cfg.HTTPBase}, {"gossip", cfg.GossipBase}} {
		if b.base < 0 || b.base > 0 && b.base+cfg.Nodes-1 > 65535 {
			return nil, fmt.Errorf("testnet: %s base port %d: want 0 (free ports) or a port from which %d nodes' ports fit below 65536", b.name, b.base, cfg.Nodes)
		}
	}
	t := &Net{}
	dir := cfg.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "kvmesh-testnet-")
		if err != nil {
			return nil, fmt.Errorf("testnet: %w", err)
		}
		dir, t.tmpDir = d, d
	}
	names := make([]string, cfg.Nodes)
	for i := range names {
		names[i] = Name(i)
	}
	if err := transport.NewDevCA(dir, names...); err != nil {
		t.Close()
		return nil, fmt.Errorf("testnet: %w", err)
	}
	t.cfg, t.dir = cfg, dir
	t.key = make([]byte, 32)
	_, _ = rand.Read(t.key)
	for i := range cfg.Nodes {
		if _, err := t.start(ctx, i, dir); err != nil {
			t.Close()
			return nil, err
		}
	}
	return t, nil
}

// Add starts one more node, joining the first, with a certificate of the testnet's CA, and
// returns it once it serves; like Start, it does not wait for gossip to converge.
func (t *Net) Add(ctx context.Context) (*node.Node, error) {
	i := len(t.Nodes)
	certs := filepath.Join(t.dir, Name(i))
	if err := transport.IssueNode(t.dir, certs, Name(i), nil); err != nil {
		return nil, fmt.Errorf("testnet: %w", err)
	}
	return t.start(ctx, i, certs)
}

// start builds and starts node i, its certificate in certs, and appends it to t.Nodes.
func (t *Net) start(ctx context.Context, i int, certs string) (*node.Node, error) {
	cfg := t.cfg
	nc := node.DefaultConfig()
	nc.Name = Name(i)
	port := 0
	if cfg.HTTPBase > 0 {
		port = cfg.HTTPBase + i
	}
	nc.HTTPAddr = net.JoinHostPort(cfg.Host, strconv.Itoa(port))
	nc.QUICAddr = net.JoinHostPort(cfg.Host, "0")
	nc.AdvertiseHost = cfg.Host
	nc.Gossip.BindAddr, nc.Gossip.BindPort, nc.Gossip.Key = cfg.Host, gossip.AnyPort, t.key
	if cfg.GossipBase > 0 {
		nc.Gossip.BindPort = cfg.GossipBase + i
	}
	if t.seed != "" {
		nc.Gossip.Join = []string{t.seed}
	}
	if cfg.Fast {
		FastGossip(&nc.Gossip)
	}
	nc.GPU = "sim"
	nc.DrainTimeout = 5 * time.Second
	nc.DrainDelay = -1 // no load balancer to wait for
	if cfg.Light {
		LightNode(&nc)
	}
	if cfg.Logger != nil {
		nc.Logger = cfg.Logger
	}
	tlsCfg, err := transport.LoadTLS(certs, nc.Name)
	if err != nil {
		return nil, fmt.Errorf("testnet: %w", err)
	}
	nc.TLS = tlsCfg
	if i < len(cfg.Roles) {
		nc.Role = cfg.Roles[i]
	}
	if cfg.Configure != nil {
		cfg.Configure(i, &nc)
	}
	if cfg.Engines == EnginesExternal {
		e, err := startEngine(ctx, nc, cfg.Host)
		if err != nil {
			return nil, fmt.Errorf("testnet: %s: engine: %w", nc.Name, err)
		}
		t.Engines = append(t.Engines, e)
		nc.Engine, nc.EngineKind, nc.Models = "http://"+e.HTTPAddr(), "vllm", nil
	}
	n, err := node.New(nc)
	if err != nil {
		return nil, fmt.Errorf("testnet: %s: %w", nc.Name, err)
	}
	if err := n.Start(ctx); err != nil {
		_ = n.Shutdown(context.Background())
		return nil, fmt.Errorf("testnet: %s: %w", nc.Name, err)
	}
	t.Nodes = append(t.Nodes, n)
	if t.seed == "" {
		t.seed = n.GossipAddr()
	}
	return n, nil
}

// startEngine starts a standalone simulated engine on host with nc's Sim and Models, for the
// node nc describes to run in front of.
func startEngine(ctx context.Context, nc node.Config, host string) (*node.Node, error) {
	ec := node.DefaultConfig()
	ec.Name = nc.Name + "-engine"
	ec.HTTPAddr = net.JoinHostPort(host, "0")
	ec.Standalone = true
	ec.GPU = "none"
	ec.Models = nc.Models
	ec.Sim = nc.Sim
	if route.IsHalf(nc.Role) {
		ec.Sim.Role = nc.Role
	}
	ec.DrainDelay, ec.DrainTimeout = -1, nc.DrainTimeout
	ec.Logger = nc.Logger
	e, err := node.New(ec)
	if err != nil {
		return nil, err
	}
	if err := e.Start(ctx); err != nil {
		return nil, errors.Join(err, e.Shutdown(context.Background()))
	}
	return e, nil
}

// URLs are the nodes' API base URLs.
func (t *Net) URLs() []string {
	out := make([]string, len(t.Nodes))
	for i, n := range t.Nodes {
		out[i] = "http://" + n.HTTPAddr()
	}
	return out
}

// WaitConverged polls until every node sees every other alive with a fresh state record.
func (t *Net) WaitConverged(ctx context.Context) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if t.converged() {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("testnet: not converged: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

func (t *Net) converged() bool {
	for _, n := range t.Nodes {
		fresh := 0
		for _, m := range n.Members() {
			if m.Liveness == gossip.LivenessAlive && m.Candidate && m.State.QUICAddr != "" {
				fresh++
			}
		}
		if fresh != len(t.Nodes) {
			return false
		}
	}
	return true
}

// GossipAddrs are the nodes' bound gossip addresses (host:port, UDP and TCP).
func (t *Net) GossipAddrs() []string {
	out := make([]string, len(t.Nodes))
	for i, n := range t.Nodes {
		out[i] = n.GossipAddr()
	}
	return out
}

// EngineURLs are the standalone engines' base URLs (none with EnginesEmbedded).
func (t *Net) EngineURLs() []string {
	out := make([]string, len(t.Engines))
	for i, e := range t.Engines {
		out[i] = "http://" + e.HTTPAddr()
	}
	return out
}

// Close shuts every node down (draining in-flight requests), then the engines behind them, and
// removes a temporary directory.
func (t *Net) Close() error {
	var errs []error
	for i := len(t.Nodes) - 1; i >= 0; i-- {
		errs = append(errs, t.Nodes[i].Shutdown(context.Background()))
	}
	for i := len(t.Engines) - 1; i >= 0; i-- {
		errs = append(errs, t.Engines[i].Shutdown(context.Background()))
	}
	if t.tmpDir != "" {
		errs = append(errs, os.RemoveAll(t.tmpDir))
	}
	return errors.Join(errs...)
}
