package node

// PrefixOf is how many of blocks, contiguous from block 0, this node's prefix index says peer
// holds now (confirmed, or speculative and unexpired): what routing scores peer with.
func (n *Node) PrefixOf(peer string, blocks []uint64) int {
	for _, m := range n.g.LongestPrefix(blocks, nil) {
		if m.Peer == peer {
			return m.Blocks
		}
	}
	return 0
}
