package gossip

import (
	"fmt"
	"io"
	"time"

	"github.com/hashicorp/memberlist"
)

// memberlistConfig is memberlist's configuration for g: its addresses, timers and key, g's
// delegates, its log and, with Config.Drop, the transport that drops.
func (g *Gossip) memberlistConfig() (*memberlist.Config, error) {
	mlc := memberlist.DefaultLANConfig()
	mlc.Name = g.cfg.Name
	mlc.BindAddr = g.cfg.BindAddr
	mlc.BindPort = max(g.cfg.BindPort, 0) // AnyPort: memberlist's 0 picks one
	mlc.AdvertiseAddr = g.cfg.AdvertiseAddr
	mlc.AdvertisePort = g.cfg.AdvertisePort
	if mlc.AdvertisePort == 0 {
		// The bound port (a free one, once picked: memberlist or newDropTransport sets it).
		// memberlist advertises an address given without a port as port 0, where no peer
		// can reach it.
		mlc.AdvertisePort = mlc.BindPort
	}
	mlc.PushPullInterval = g.cfg.PushPullInterval
	setDur(&mlc.ProbeInterval, g.cfg.ProbeInterval)
	setDur(&mlc.ProbeTimeout, g.cfg.ProbeTimeout)
	setDur(&mlc.GossipInterval, g.cfg.GossipInterval)
	setDur(&mlc.TCPTimeout, g.cfg.TCPTimeout)
	setDur(&mlc.DeadNodeReclaimTime, g.cfg.DeadNodeReclaimTime)
	if g.cfg.GossipNodes > 0 {
		mlc.GossipNodes = g.cfg.GossipNodes
	}
	if g.cfg.SuspicionMult > 0 {
		mlc.SuspicionMult = g.cfg.SuspicionMult
	}
	if g.cfg.RetransmitMult > 0 {
		mlc.RetransmitMult = g.cfg.RetransmitMult
	}
	if len(g.cfg.Key) > 0 {
		kr, err := memberlist.NewKeyring(nil, g.cfg.Key)
		if err != nil {
			return nil, fmt.Errorf("gossip: keyring: %w", err)
		}
		mlc.Keyring = kr
		mlc.GossipVerifyIncoming = true
		mlc.GossipVerifyOutgoing = true
	}
	mlc.Delegate = &delegate{g}
	mlc.Events = &events{g}
	mlc.Conflict = conflicts{g}
	mlc.LogOutput = io.Discard
	if g.cfg.Logger != nil {
		mlc.LogOutput = newLogWriter(g.cfg.Logger)
	}
	if g.cfg.Drop != nil {
		dt, err := newDropTransport(mlc, g.cfg.Drop)
		if err != nil {
			return nil, fmt.Errorf("gossip: start memberlist: %w", err)
		}
		mlc.Transport = dt
	}
	return mlc, nil
}

func setDur(dst *time.Duration, v time.Duration) {
	if v > 0 {
		*dst = v
	}
}

// getBroadcasts hands memberlist the queued state records that fit limit bytes and the
// bandwidth budget, which state records and prefix rounds share.
func (g *Gossip) getBroadcasts(overhead, limit int) [][]byte {
	g.mu.Lock()
	g.budget.Refill(time.Now())
	limit = min(limit, int(g.budget.Tokens))
	g.mu.Unlock()
	if limit <= overhead {
		return nil
	}
	msgs := g.queue.GetBroadcasts(overhead, limit)
	sent := 0
	for _, m := range msgs {
		sent += len(m) + overhead
	}
	if sent > 0 {
		g.mu.Lock()
		g.budget.Tokens -= float64(sent)
		g.mu.Unlock()
		g.met.sent.Add(float64(sent))
	}
	return msgs
}

// delegate adapts memberlist.Delegate to Gossip.
type delegate struct{ g *Gossip }

func (d *delegate) NodeMeta(int) []byte {
	if d.g.leaving.Load() {
		return []byte{metaLeaving}
	}
	return nil
}
func (d *delegate) NotifyMsg(b []byte)                  { d.g.handleMsg(b) }
func (d *delegate) GetBroadcasts(o, limit int) [][]byte { return d.g.getBroadcasts(o, limit) }
func (d *delegate) LocalState(bool) []byte              { return d.g.localState() }
func (d *delegate) MergeRemoteState(b []byte, _ bool)   { d.g.mergeRemoteState(b) }

// metaLeaving is a member's memberlist meta while it leaves (Gossip.leaving).
const metaLeaving = 1

// events adapts memberlist.EventDelegate to Gossip.
type events struct{ g *Gossip }

func (e *events) NotifyJoin(n *memberlist.Node) { e.g.memberEvent(n, LivenessAlive) }
func (e *events) NotifyUpdate(n *memberlist.Node) {
	e.g.memberEvent(n, "")
}
func (e *events) NotifyLeave(n *memberlist.Node) {
	live := LivenessDead
	if len(n.Meta) > 0 && n.Meta[0] == metaLeaving {
		live = LivenessLeft
	}
	e.g.memberEvent(n, live)
}

// namedBroadcast is a state record: a newer one from the same origin replaces it in the queue.
type namedBroadcast struct {
	name string
	msg  []byte
}

func (b *namedBroadcast) Name() string { return "state/" + b.name }
func (b *namedBroadcast) Invalidates(o memberlist.Broadcast) bool {
	ob, ok := o.(*namedBroadcast)
	return ok && ob.name == b.name
}
func (b *namedBroadcast) Message() []byte { return b.msg }
func (b *namedBroadcast) Finished()       {}
