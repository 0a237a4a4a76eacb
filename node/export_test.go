package node

// KillTransport closes the node's QUIC transport abruptly, as a crashed process would, while
// gossip still lists the node as alive: peers' forwards to it fail until they notice.
func (n *Node) KillTransport() error { return n.tr.Close() }
