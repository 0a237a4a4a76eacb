package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/plan"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/node/journey"
	"github.com/kvmesh/kvmesh/node/metrics"
	"github.com/kvmesh/kvmesh/node/transport"
)

// buildMesh builds routing, admission, telemetry and, outside Standalone, the gossip member
// and the QUIC transport. Nothing is bound yet.
func (n *Node) buildMesh() error {
	policy, err := route.NewPolicy(n.cfg.Policy, n.cfg.Route)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	if n.eject, err = route.NewEjector(n.cfg.Route.Eject); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	if n.retries, err = route.NewRetryBudget(n.cfg.Route.RetryBudget); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	ac := n.cfg.Admit
	ac.ModelInfo = n.meshModelInfo
	if n.adm, err = admit.New(ac); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	if err := n.buildAgents(); err != nil {
		return err
	}
	if err := n.buildTelemetry(); err != nil {
		return err
	}
	mode, err := plan.ParseMode(n.cfg.Admission)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	var grid plan.Grid // a nil *carbon.Tracker must stay a nil Grid
	if n.carbon != nil {
		grid = n.carbon
	}
	pc := plan.Config{Mode: mode, QueueCap: n.cfg.QueueCap, Agents: n.agents != nil, RetryAfter: n.cfg.RetryAfter}
	if n.planner, err = plan.New(pc, n.adm, policy, grid); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	n.reg.MustRegister(metrics.NewStateCollector(metrics.StateSources{
		Policy: n.planner.Policy(), Room: n.adm.Room(), Engine: n.eng, ConfigHash: n.configHash}))
	if n.cfg.Standalone {
		return nil
	}
	gc := n.cfg.Gossip
	gc.Name, gc.Logger, gc.Registerer = n.cfg.Name, n.log, n.reg
	if n.g, err = gossip.New(gc); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	n.tr, err = transport.New(transport.Config{
		TLS: n.cfg.TLS, ListenAddr: n.cfg.QUICAddr, Handler: transport.HandlerFunc(n.servePeer), Logger: n.log, Registerer: n.reg,
		HandshakeTimeout: n.cfg.HandshakeTimeout,
	})
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	return nil
}

// CodeIngressMismatch is an owner's refusal (403) of a forward whose header names an ingress
// other than the node the sender's certificate was issued for.
const CodeIngressMismatch = journey.CodeIngressMismatch

// servePeer serves a forward from the node its header says sent it (Header.Ingress): the one
// its certificate names, or any with a certificate issued for any node. The owner takes that
// name as given (it leaves that node's own KV claims out of the request's way), so one member
// must not pass for another.
func (n *Node) servePeer(ctx context.Context, h transport.Header, body []byte, w transport.ResponseWriter) {
	if name, anyNode, ok := transport.PeerName(ctx); !ok || name != h.Ingress && !anyNode {
		n.log.Warn("forward refused: its certificate is another node's", "id", h.RequestID, "ingress", h.Ingress, "certificate", name)
		_ = w.Refuse(transport.Refusal{Status: http.StatusForbidden, Code: CodeIngressMismatch,
			Message: fmt.Sprintf("the forward names ingress %q but comes with the certificate of %q", h.Ingress, name)})
		return
	}
	n.ServeForward(ctx, h, body, w)
}

// CodeDraining is the refusal (503) of a node that is shutting down.
const CodeDraining = journey.CodeDraining

// CodeOwnerUnreachable is the failure (502) of a request whose last attempt could not reach
// its owner: the QUIC handshake or the stream failed before any answer.
const CodeOwnerUnreachable = journey.CodeOwnerUnreachable

// advertise picks the address peers reach this node at for a bound listener.
func (n *Node) advertise(bound net.Addr) string {
	host := n.cfg.AdvertiseHost
	if host == "" {
		host = n.cfg.Gossip.AdvertiseAddr
	}
	var port string
	switch a := bound.(type) {
	case *net.TCPAddr:
		port = strconv.Itoa(a.Port)
		if host == "" && !a.IP.IsUnspecified() {
			host = a.IP.String()
		}
	case *net.UDPAddr:
		port = strconv.Itoa(a.Port)
		if host == "" && !a.IP.IsUnspecified() {
			host = a.IP.String()
		}
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// startMesh starts the transport and the gossip member, then the background loops.
func (n *Node) startMesh(ctx context.Context) error {
	bg, cancel := context.WithCancel(context.Background())
	n.bgCancel = cancel
	if n.cfg.APIKeysFile != "" {
		n.reloadMu.Lock()
		err := n.loadKeysLocked(time.Now())
		n.reloadMu.Unlock()
		if err != nil {
			return err
		}
	}
	if n.cfg.ConfigWatch > 0 && (n.cfg.ConfigFile != "" || n.cfg.APIKeysFile != "") {
		n.goBG(func() { n.watchFiles(bg, n.cfg.ConfigWatch) })
	}
	n.goBG(func() { n.x.RunRoom(bg, n.roomSecond, n.publishClaims) })
	n.goBG(func() { _ = n.gpu.Run(bg) })
	if n.carbon != nil {
		n.grid.Export(time.Now())
		n.goBG(func() { n.grid.Run(bg) })
	}
	if n.agents != nil {
		n.goBG(func() { n.runAgents(bg) })
	}
	if n.cfg.Standalone {
		return nil
	}
	// The transport serves until Close; ctx only bounds starting up.
	if err := n.tr.Start(bg); err != nil {
		return fmt.Errorf("node: quic: %w", err)
	}
	n.advertiseQUIC = n.advertise(n.tr.Addr())
	n.g.SetLocal(n.publishedState)
	if n.sim != nil {
		n.g.SetSnapshot(n.sim.ResidentAnchors)
	} else if n.ext != nil {
		n.g.SetSnapshot(n.ext.ResidentAnchors)
	}
	if err := n.g.Start(ctx); err != nil {
		return fmt.Errorf("node: gossip: %w", err)
	}
	return nil
}

// ticking calls f every interval until ctx ends.
func ticking(ctx context.Context, every time.Duration, f func()) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f()
	}
}

func (n *Node) goBG(f func()) {
	n.bg.Add(1)
	go func() {
		defer n.bg.Done()
		f()
	}()
}

// stopMesh leaves the mesh and stops the background loops and the transport.
func (n *Node) stopMesh() error {
	var errs []error
	if n.g != nil {
		errs = append(errs, n.g.Close())
	}
	if n.tr != nil {
		errs = append(errs, n.tr.Close())
	}
	if n.bgCancel != nil {
		n.bgCancel()
	}
	n.bg.Wait()
	errs = append(errs, n.gpu.Close())
	return errors.Join(errs...)
}

// drain closes the listener and waits up to the drain timeout (or ctx) until no request,
// local or forwarded here, is in flight; past it, the stragglers' connections are closed.
func (n *Node) drain(ctx context.Context) error {
	n.log.Info("draining", "timeout", n.cfg.DrainTimeout)
	dctx, cancel := context.WithTimeout(ctx, n.cfg.DrainTimeout)
	defer cancel()
	// httpSrv.Shutdown closes the listener and the idle connections and waits for the rest,
	// but it counts a connection that never sent a request as busy for 5 s (HTTP clients dial
	// spares), so the drain ends when no request, local or forwarded, is in flight, whatever
	// such connections do.
	quiet, stop := context.WithCancel(dctx)
	go func() {
		if n.waitIdle(quiet) == nil {
			stop()
		}
	}()
	_ = n.httpSrv.Shutdown(quiet)
	stop()
	err := n.waitIdle(dctx)
	if err != nil && n.serving.Load() == 0 && n.forwarded.Load() == 0 {
		err = nil // the last request ended as the deadline passed
	}
	if err != nil {
		err = n.endStragglers(err)
	}
	// Unused connections close now, and so do those of stragglers that did not end.
	_ = n.httpSrv.Close()
	if n.admSrv != nil {
		// Metrics and the mesh view stayed readable through the drain.
		_ = n.admSrv.Close()
	}
	if err != nil {
		return fmt.Errorf("node: drain: %w", err)
	}
	return nil
}

// endStragglers ends what is still in flight when the drain's deadline (cause) passed. The
// client requests end with an explicit error (a stream's error event, a 503), given drainGrace
// to write it before their connections close. Forwarded requests run on until the transport
// closes, when their ingresses move what is left of them to other nodes; one that ends within
// drainGrace has completed. The drain failed (cause) if it cut a client request or a forwarded
// one is still running after the grace; it succeeded if only forwarded requests were left
// and each completed within the grace.
func (n *Node) endStragglers(cause error) error {
	cut, fwd := n.serving.Load(), n.forwarded.Load()
	n.log.Warn("drain timeout passed: ending the requests still in flight", "timeout", n.cfg.DrainTimeout,
		"requests", cut, "forwarded", fwd)
	n.endRequests(journey.ErrDrainTimeout)
	grace, cancel := context.WithTimeout(context.Background(), drainGrace)
	defer cancel()
	if n.waitIdle(grace) == nil && cut == 0 {
		return nil
	}
	return fmt.Errorf("in flight when the drain timeout (%v) passed: %d client requests, %d forwarded (%d still running after %v): %w",
		n.cfg.DrainTimeout, cut, fwd, n.forwarded.Load(), drainGrace, cause)
}

// drainGrace is how long requests cut by the drain timeout have to tell their clients so.
const drainGrace = time.Second
