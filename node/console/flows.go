package console

import (
	"sync"
)

// Other is the peer name the forwards to and from peers past Flows' bound are counted under.
const Other = "(other)"

// Flow counts the forwards between this node and one peer, both ways.
type Flow struct {
	Sent     uint64 `json:"sent"`
	Received uint64 `json:"received"`
}

// Flows counts this node's forwards by peer: its row (sent) and column (received) of the
// mesh's forward matrix. At most maxPeers peers are counted by name; the rest under Other.
type Flows struct {
	mu       sync.Mutex
	maxPeers int
	by       map[string]*Flow
}

// NewFlows returns counters for at most maxPeers named peers (at least 1).
func NewFlows(maxPeers int) *Flows {
	return &Flows{maxPeers: max(maxPeers, 1), by: make(map[string]*Flow)}
}

// Sent counts a forward this node sent to peer.
func (f *Flows) Sent(peer string) { f.add(peer, true) }

// Received counts a forward this node received from peer.
func (f *Flows) Received(peer string) { f.add(peer, false) }

func (f *Flows) add(peer string, sent bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.by[peer]
	if c == nil {
		if len(f.by) >= f.maxPeers {
			peer = Other
			c = f.by[peer]
		}
		if c == nil {
			c = &Flow{}
			f.by[peer] = c
		}
	}
	if sent {
		c.Sent++
	} else {
		c.Received++
	}
}

// Snapshot returns a copy of the counters by peer.
func (f *Flows) Snapshot() map[string]Flow {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]Flow, len(f.by))
	for p, c := range f.by {
		out[p] = *c
	}
	return out
}
