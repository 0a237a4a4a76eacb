package gossip

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// joinWarnEvery bounds the WARN lines of a node that keeps failing to join its seeds: one at
// the first failure, then at most one this often, counting the failures in between.
const joinWarnEvery = time.Minute

// joinState is what the last join of the seeds found; its own lock, since memberlist's Join
// calls back into the delegates that take g.mu.
type joinState struct {
	mu       sync.Mutex
	err      error     // why the last join reached no peer; nil after one that did
	failures int       // failed joins since the last WARN
	warned   time.Time // the last WARN
}

// JoinFailing returns why this node cannot join its seeds, while it is alone and its last join
// of them reached no other member (a wrong gossip key, the seeds down or unreachable); nil when
// it has no seeds, its last join worked, or a peer has joined it since. Such a node serves alone:
// it is ready, since a fleet restarting at once must serve before its seeds are back, but it
// says so in /readyz, kvmesh status and kvmesh_gossip_join_failing.
func (g *Gossip) JoinFailing() error {
	if g.alive.Load() > 1 {
		return nil
	}
	g.join.mu.Lock()
	defer g.join.mu.Unlock()
	return g.join.err
}

// joinSeeds joins the seeds once and records the outcome; memberlist's Join takes no context,
// each seed attempt is bounded by TCPTimeout. It reports whether this node has a peer after it.
func (g *Gossip) joinSeeds(now time.Time, ml *memberlist.Memberlist) bool {
	n, err := ml.Join(g.cfg.Join)
	joined := ml.NumMembers() > 1
	switch {
	case joined:
		err = nil
	case err == nil:
		// Join counts this node itself when it is among the seeds: alone after it, every
		// other seed refused or did not answer, and memberlist kept their errors to itself.
		if n >= len(g.cfg.Join) {
			break // the seeds are only this node: the first of its mesh, not failing
		}
		err = fmt.Errorf("reached %d of %d seeds and no other member (this node among them)", n, len(g.cfg.Join))
	}
	g.noteJoin(now, err)
	if joined {
		g.log.Info("joined", "seeds", g.cfg.Join, "contacted", n, "members", ml.NumMembers())
	} else if err == nil {
		g.log.Debug("join: still alone", "seeds", g.cfg.Join, "contacted", n)
	}
	return joined
}

// noteJoin records a join's failure (err) or success (nil), logs a failure at WARN at a
// bounded rate (joinWarnEvery), and sets the gauge.
func (g *Gossip) noteJoin(now time.Time, err error) {
	g.join.mu.Lock()
	prev := g.join.err
	g.join.err = err
	var warn bool
	failures := 0
	if err != nil {
		g.join.failures++
		if prev == nil || now.Sub(g.join.warned) >= joinWarnEvery {
			warn, failures = true, g.join.failures
			g.join.failures, g.join.warned = 0, now
		}
	} else {
		g.join.failures = 0
	}
	g.join.mu.Unlock()
	g.setJoinGauge()
	if warn {
		g.log.Warn("join failed: serving alone until a seed can be joined (a wrong gossip key, or the seeds down); retrying in background",
			"seeds", g.cfg.Join, "failures", failures, "err", err)
	}
}

// setJoinGauge sets kvmesh_gossip_join_failing from JoinFailing.
func (g *Gossip) setJoinGauge() {
	v := 0.0
	if g.JoinFailing() != nil {
		v = 1
	}
	g.met.joinFailing.Set(v)
}

// joinLoop joins the seeds again whenever this node is alone: after a first join that failed,
// and after one that reached only this node itself (two nodes started together whose seed name
// resolved to themselves would otherwise stay two meshes for good), or once every peer left.
func (g *Gossip) joinLoop(ctx context.Context) {
	defer g.wg.Done()
	backoff := 100 * time.Millisecond
	for {
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		g.mu.Lock()
		ml := g.ml
		g.mu.Unlock()
		if ml.NumMembers() > 1 {
			backoff = g.cfg.JoinRetryMax // not alone: look again later
			continue
		}
		if g.joinSeeds(time.Now(), ml) {
			backoff = g.cfg.JoinRetryMax
			continue
		}
		backoff = min(2*backoff, g.cfg.JoinRetryMax)
	}
}
