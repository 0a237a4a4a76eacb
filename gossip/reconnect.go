package gossip

import (
	"cmp"
	"context"
	"math/rand/v2"
	"net"
	"time"
)

// reconnectLoop tries, every PushPullInterval, to join again one member this node holds dead
// (one that left is not tried). memberlist neither probes a dead member nor exchanges state
// with it, so after a partition long enough for each side to declare the other dead the two
// would stay apart once the network heals. A join's push/pull tells each side that the other
// holds it dead, which it refutes, and both are alive again; serf reconnects the same way. A
// member that really died costs one failed dial a try, until DeadRetention forgets it.
func (g *Gossip) reconnectLoop(ctx context.Context) {
	defer g.wg.Done()
	t := time.NewTicker(g.cfg.PushPullInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		name, addr := g.deadPeer()
		if addr == "" {
			continue
		}
		// A dial of its own first, which Close cancels: memberlist's cannot be, and to a host
		// that is gone it would hold the loop, and Close, for TCPTimeout.
		d := net.Dialer{Timeout: cmp.Or(g.cfg.TCPTimeout, 10*time.Second)}
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			g.log.Debug("reconnect to a member held dead failed", "peer", name, "addr", addr, "err", err)
			continue
		}
		_ = conn.Close()
		g.mu.Lock()
		ml := g.ml
		g.mu.Unlock()
		if _, err := ml.Join([]string{addr}); err != nil {
			g.log.Debug("reconnect to a member held dead failed", "peer", name, "addr", addr, "err", err)
			continue
		}
		g.log.Info("reconnected to a member held dead", "peer", name, "addr", addr)
	}
}

// deadPeer picks one member held dead at random, or returns "" when there is none.
func (g *Gossip) deadPeer() (name, addr string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for pn, p := range g.peers {
		if pn == g.cfg.Name || p.liveness != LivenessDead || p.addr == "" {
			continue
		}
		if n++; rand.IntN(n) == 0 { // reservoir sampling: each with probability 1/n
			name, addr = pn, p.addr
		}
	}
	return name, addr
}
