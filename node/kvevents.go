package node

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/kvmesh/kvmesh/node/engine/kvevents"
	"github.com/kvmesh/kvmesh/node/engine/sim"
	"github.com/kvmesh/kvmesh/node/openai"
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

// CodeCacheInUse (409): POST /reset_prefix_cache while requests run.
const CodeCacheInUse = "cache_in_use"

// handleResetPrefixCache empties the embedded engine's prefix cache, as vLLM's POST
// /reset_prefix_cache does (in its development mode), and publishes AllBlocksCleared. Only
// kvmesh engine serves it: a standalone node has no gossip to tell.
func (n *Node) handleResetPrefixCache(w http.ResponseWriter, r *http.Request) {
	held, err := n.sim.ResetPrefixCache()
	if errors.Is(err, sim.ErrCacheInUse) {
		openai.WriteError(w, openai.NewError(http.StatusConflict, CodeCacheInUse, err.Error()))
		return
	}
	if n.kvpub != nil {
		n.kvpub.Publish(kvevents.Event{Kind: kvevents.AllBlocksCleared})
	}
	n.log.Info("prefix cache reset", "blocks", len(held))
	w.WriteHeader(http.StatusOK)
}
