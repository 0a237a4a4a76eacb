package external

import (
	"github.com/kvmesh/kvmesh/node/engine/kvevents"
	"github.com/kvmesh/kvmesh/node/engine/residency"
)

// The server's KV cache events (Config.KVEvents), applied to the residency model. Their
// block hashes are over the server's token ids, which the node does not have, so they cannot
// name kvmesh's blocks; what they tell is when and how much the server stores and evicts:
//
//   - AllBlocksCleared empties the model at once.
//   - BlockRemoved evicts as many of the model's least recently used blocks, converted from
//     the server's blocks to kvmesh's by tokens, less those the model already evicted on its
//     own for room since the last removal (it makes room when a prompt enters, and the server
//     evicts for the same prompt, in either order).
//   - BlockStored counts the blocks the server holds; while that count is exact (the node has
//     read the stream since the server's cache was empty, and missed nothing since), the
//     model holds no more unpinned blocks than that.

// kvState is what the events said, guarded by shadow.mu.
type kvState struct {
	held      map[uint64]struct{} // the server's GPU blocks, by its hash
	exact     bool                // held is everything the server holds
	blockSize int                 // the server's block size, from its last BlockStored
	removed   float64             // kvmesh tokens removed and not yet evicted (under a block)
	credit    int                 // blocks the model evicted for room since the last removal
}

// creditLocked notes blocks the model evicted for room: a removal event for them will come.
func (r *shadow) creditLocked(evicted int) {
	if r.kv != nil {
		r.kv.credit = min(r.kv.credit+evicted, r.model.Capacity())
	}
}

// onKVBatch applies one batch of the server's events (the subscriber's OnBatch).
func (r *shadow) onKVBatch(b kvevents.Batch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	kv := r.kv
	switch {
	case b.Restarted: // a server read from its start: its cache was empty then
		clear(kv.held)
		kv.exact, kv.credit, kv.removed = !b.Missed, 0, 0
	case b.Missed:
		kv.exact = false
	}
	for _, e := range b.Events {
		if e.Medium != "" && e.Medium != kvevents.MediumGPU {
			continue // an offloaded tier's blocks, not the cache the model stands for
		}
		switch e.Kind {
		case kvevents.AllBlocksCleared:
			n := r.model.Len()
			r.model.Clear(&r.d)
			clear(kv.held)
			kv.exact, kv.credit, kv.removed = true, 0, 0
			r.log.Info("engine cleared its prefix cache", "blocks_forgotten", n)
		case kvevents.BlockStored:
			if e.BlockSize > 0 {
				kv.blockSize = e.BlockSize
			}
			for _, h := range e.Hashes {
				if len(kv.held) >= residency.MaxBlocks {
					kv.exact = false
					break
				}
				kv.held[h] = struct{}{}
			}
		case kvevents.BlockRemoved:
			for _, h := range e.Hashes {
				delete(kv.held, h)
			}
			r.evictRemovedLocked(len(e.Hashes))
		}
	}
	if kv.exact {
		r.model.Cap(r.kvmeshBlocksLocked(len(kv.held)), &r.d)
	}
	r.publishLocked()
}

// evictRemovedLocked evicts from the model what n removed server blocks come to.
func (r *shadow) evictRemovedLocked(n int) {
	kv := r.kv
	bt := r.model.BlockTokens()
	kv.removed += float64(n*r.kvBlockSizeLocked()) * r.tokenRatioLocked()
	blocks := int(kv.removed) / bt
	kv.removed -= float64(blocks * bt)
	paid := min(blocks, kv.credit)
	kv.credit -= paid
	r.model.EvictOldest(blocks-paid, &r.d)
}

// kvmeshBlocksLocked converts n server blocks to kvmesh blocks, by tokens, rounded up: the
// cap it sets errs toward keeping blocks.
func (r *shadow) kvmeshBlocksLocked(n int) int {
	bt := r.model.BlockTokens()
	return (int(float64(n*r.kvBlockSizeLocked())*r.tokenRatioLocked()) + bt - 1) / bt
}

// kvBlockSizeLocked is the server's block size in its tokens: its events' own, else its
// metrics', else kvmesh's.
func (r *shadow) kvBlockSizeLocked() int {
	switch {
	case r.kv.blockSize > 0:
		return r.kv.blockSize
	case r.engineBlock > 0:
		return r.engineBlock
	}
	return r.model.BlockTokens()
}

// tokenRatioLocked is kvmesh's tokens per server token over the prompts the server reported
// (1 until it has reported one).
func (r *shadow) tokenRatioLocked() float64 {
	if r.enginePrompt <= 0 {
		return 1
	}
	return r.kvmeshPrompt / r.enginePrompt
}
