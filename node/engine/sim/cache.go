package sim

import "github.com/kvmesh/kvmesh/kvindex"

// blockCache is the paged KV pool's accounting. It does not track physical block numbers, only
// counts: a block is private (held by one sequence, not hashed: partial prompt blocks, output
// blocks, prompt blocks whose prefill is still running), cached (hashed prompt block, possibly
// shared by several sequences through refs), or free. Cached blocks that no sequence holds sit
// on an LRU list and are evicted from its front when space is needed.
type blockCache struct {
	total   int
	private int // blocks held privately by sequences
	entries map[uint64]*centry
	// LRU of evictable entries (refs == 0): head is evicted first.
	head, tail *centry
	evictable  int
	held       int // entries with refs > 0
}

type centry struct {
	hash       uint64
	pos        int // the block's place in the chain it was stored from, for kvindex.Anchor
	refs       int
	prev, next *centry
	inLRU      bool
}

func newBlockCache(total int) *blockCache {
	return &blockCache{total: total, entries: make(map[uint64]*centry)}
}

// free is the number of blocks neither private nor cached.
func (c *blockCache) free() int { return c.total - c.private - len(c.entries) }

// available is how many blocks an allocation can obtain, evicting if needed.
func (c *blockCache) available() int { return c.free() + c.evictable }

// used is vLLM's kv_cache_usage numerator: blocks held by running sequences.
func (c *blockCache) used() int { return c.private + c.held }

func (c *blockCache) pushBack(e *centry) {
	e.prev, e.next = c.tail, nil
	if c.tail != nil {
		c.tail.next = e
	} else {
		c.head = e
	}
	c.tail = e
	e.inLRU = true
	c.evictable++
}

func (c *blockCache) unlink(e *centry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		c.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		c.tail = e.prev
	}
	e.prev, e.next, e.inLRU = nil, nil, false
	c.evictable--
}

// lookup returns how many of blocks, contiguous from block 0, are cached, up to max.
func (c *blockCache) lookup(blocks []uint64, max int) (hits, evictableHits int) {
	for _, h := range blocks {
		if hits >= max {
			break
		}
		e, ok := c.entries[h]
		if !ok {
			break
		}
		if e.inLRU {
			evictableHits++
		}
		hits++
	}
	return hits, evictableHits
}

// acquire takes a reference on each of blocks, which must all be cached.
func (c *blockCache) acquire(blocks []uint64) {
	for _, h := range blocks {
		e := c.entries[h]
		if e.inLRU {
			c.unlink(e)
		}
		if e.refs == 0 {
			c.held++
		}
		e.refs++
	}
}

// release drops a reference on each of blocks. It walks them tail first so that, once nothing
// holds them, a prefix's last blocks are evicted before its first (the head blocks are the ones
// other requests share).
func (c *blockCache) release(blocks []uint64) {
	for i := len(blocks) - 1; i >= 0; i-- {
		e := c.entries[blocks[i]]
		e.refs--
		if e.refs == 0 {
			c.held--
			c.pushBack(e)
		}
	}
}

// allocate makes n private blocks, evicting LRU entries as needed into d. It reports false,
// changing nothing, if n blocks cannot be had.
func (c *blockCache) allocate(n int, d *kvindex.CacheDelta) bool {
	if n > c.available() {
		return false
	}
	for c.free() < n {
		e := c.head
		c.unlink(e)
		delete(c.entries, e.hash)
		d.Evict(e.hash, e.pos)
	}
	c.private += n
	return true
}

// freePrivate returns n private blocks to the free pool.
func (c *blockCache) freePrivate(n int) { c.private -= n }

// store turns one private block holding hash h, block pos of its chain, into a cached block
// the caller keeps a reference on. If h is already cached (another sequence computed the same
// prefix concurrently) the private copy is freed and the existing entry shared. It reports
// whether the hash is new to the cache.
func (c *blockCache) store(h uint64, pos int) bool {
	c.private--
	if e, ok := c.entries[h]; ok {
		if e.inLRU {
			c.unlink(e)
		}
		if e.refs == 0 {
			c.held++
		}
		e.refs++
		return false
	}
	c.entries[h] = &centry{hash: h, pos: pos, refs: 1}
	c.held++
	return true
}

// demote moves the evictable entries among blocks to the front of the LRU, so that they are
// evicted before anything else, the last block of the prefix first. Blocks not cached or held
// by a sequence are left alone. It returns how many it moved.
func (c *blockCache) demote(blocks []uint64) int {
	n := 0
	for _, h := range blocks {
		e, ok := c.entries[h]
		if !ok || !e.inLRU {
			continue
		}
		c.unlink(e)
		c.pushFront(e)
		n++
	}
	return n
}

func (c *blockCache) pushFront(e *centry) {
	e.prev, e.next = nil, c.head
	if c.head != nil {
		c.head.prev = e
	} else {
		c.tail = e
	}
	c.head = e
	e.inLRU = true
	c.evictable++
}

// resident appends every cached hash to dst, or, with anchors, only the anchors' (by the
// position each was stored at).
func (c *blockCache) resident(dst []uint64, anchors bool) []uint64 {
	for h, e := range c.entries {
		if !anchors || kvindex.Anchor(e.pos) {
			dst = append(dst, h)
		}
	}
	return dst
}
