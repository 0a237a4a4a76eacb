package node

// PrefixOf is the anchored run of blocks, from block 0, this node's prefix index says peer
// holds now (confirmed, or speculative and unexpired): what routing scores peer with.
func (n *Node) PrefixOf(peer string, blocks []uint64) int {
	for _, m := range n.g.LongestPrefix(blocks, nil) {
		if m.Peer == peer {
			return m.Blocks
		}
	}
	return 0
}

// IndexedBlocks is peer's confirmed residency in this node's prefix index, least recent first.
func (n *Node) IndexedBlocks(peer string) []uint64 {
	return n.g.Index().AppendPeerBlocks(nil, peer)
}
