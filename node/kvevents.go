package node

import (
	"fmt"

	"github.com/kvmesh/kvmesh/node/engine/kvevents"
)

// The embedded engine's KV cache events, published in vLLM's format (Config.PublishKVEvents)
// so that kvmesh engine stands in for vLLM in front of a node that reads them, and its
// POST /reset_prefix_cache.

// buildKVPublisher builds the publisher of the embedded engine's events, of blocks of
// blockTokens tokens; it binds at Start.
func (n *Node) buildKVPublisher(blockTokens int) error {
	if n.cfg.PublishKVEvents == "" {
		return nil
	}
	p, err := kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: n.cfg.PublishKVEvents})
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	n.kvpub, n.kvBlockTokens = p, blockTokens
	return nil
}

// publishKV publishes one report of the embedded engine's cache: its evictions, then its
// stores (an eviction makes the room a store takes).
func (n *Node) publishKV(stored, evicted []uint64) {
	if n.kvpub == nil {
		return
	}
	var evs []kvevents.Event
	if len(evicted) > 0 {
		evs = append(evs, kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: evicted, Medium: kvevents.MediumGPU})
	}
	if len(stored) > 0 {
		evs = append(evs, kvevents.Event{Kind: kvevents.BlockStored, Hashes: stored, BlockSize: n.kvBlockTokens,
			Medium: kvevents.MediumGPU})
	}
	n.kvpub.Publish(evs...)
}

// KVEventsAddr is the bound endpoint of the embedded engine's KV events ("" without them, or
// before Start).
func (n *Node) KVEventsAddr() string {
	if n.kvpub == nil {
		return ""
	}
	return n.kvpub.Addr()
}
