package node

import "time"

// KillTransport closes the node's QUIC transport abruptly, as a crashed process would, while
// gossip still lists the node as alive: peers' forwards to it fail until they notice.
func (n *Node) KillTransport() error { return n.tr.Close() }

// RegisterAgent registers agent id at this node as its home, as if one step of it had run
// here: what an ingress that placed it here before gossip told it otherwise leaves behind.
func (n *Node) RegisterAgent(id string) error {
	g := n.agents
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	if _, err := g.home.Arrive(now, id, 100); err != nil {
		return err
	}
	g.home.StepDone(now, id, 110, false, nil)
	return nil
}

// RefreshMeshTokens takes the peers' published bytes per token now, as the room loop does
// once a second.
func (n *Node) RefreshMeshTokens() { n.updateMeshTokens() }
