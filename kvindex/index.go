package kvindex

import (
	"math/bits"
	"slices"
	"strings"
	"sync"
	"time"
)

// DefaultMaxBlocksPerPeer bounds one peer's residency when IndexConfig leaves it zero:
// 65,536 blocks of 16 tokens is one million tokens of KV, a large GPU's worth.
const DefaultMaxBlocksPerPeer = 1 << 16

// smallSet is the size up to which a block's holders are kept as a slice of peer ids; more
// holders switch to a bitset so lookups over a thousand peers stay word-at-a-time.
const smallSet = 16

// IndexConfig bounds an Index.
type IndexConfig struct {
	// MaxBlocksPerPeer caps confirmed blocks per peer (LRU: the least recently added go
	// first) and, separately, speculative blocks per peer. ≤ 0 means DefaultMaxBlocksPerPeer.
	MaxBlocksPerPeer int
}

// Match is one peer's anchored run of a request's blocks, from block 0 (see LongestPrefix).
type Match struct {
	Peer   string
	Blocks int
}

// Index is the per-peer residency of block hashes. It is safe for concurrent use.
type Index struct {
	mu      sync.RWMutex
	max     int
	ids     map[string]uint32
	peers   []*peer // by id; nil for a free id
	free    []uint32
	holders map[uint64]*holderSet
	scratch sync.Pool
}

type peer struct {
	name string
	id   uint32
	// Confirmed residency: an LRU list over a slab, head = most recent.
	at         map[uint64]int32
	nodes      []lruNode
	head, tail int32
	freeNode   int32
	// Speculative residency: block → expiry, and a FIFO of additions for bounded cleanup.
	spec  map[uint64]time.Time
	specQ []specEntry
}

type lruNode struct {
	hash       uint64
	prev, next int32
}

type specEntry struct {
	hash    uint64
	expires time.Time
}

type scratch struct{ active, keep []uint64 }

// NewIndex returns an empty index.
func NewIndex(cfg IndexConfig) *Index {
	if cfg.MaxBlocksPerPeer <= 0 {
		cfg.MaxBlocksPerPeer = DefaultMaxBlocksPerPeer
	}
	return &Index{
		max:     cfg.MaxBlocksPerPeer,
		ids:     make(map[string]uint32),
		holders: make(map[uint64]*holderSet),
		scratch: sync.Pool{New: func() any { return new(scratch) }},
	}
}

func (x *Index) peerLocked(name string) *peer {
	if id, ok := x.ids[name]; ok {
		return x.peers[id]
	}
	var id uint32
	if n := len(x.free); n > 0 {
		id = x.free[n-1]
		x.free = x.free[:n-1]
	} else {
		id = uint32(len(x.peers))
		x.peers = append(x.peers, nil)
	}
	p := &peer{name: name, id: id, at: make(map[uint64]int32), head: -1, tail: -1, freeNode: -1}
	x.peers[id] = p
	x.ids[name] = id
	return p
}

// Add records that peer holds blocks, in order (the last is the most recent). Re-adding a
// held block refreshes it; past the cap the least recent blocks are forgotten. A confirmed
// block supersedes a speculative entry for it. Add, Remove and Replace take hashes as given:
// a node sends only anchors; every block of an older node costs memory, but lookups, which
// consult only anchors, stay right.
func (x *Index) Add(peer string, blocks []uint64) {
	if len(blocks) == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.addLocked(x.peerLocked(peer), blocks)
}

func (x *Index) addLocked(p *peer, blocks []uint64) {
	if len(blocks) > x.max {
		blocks = blocks[len(blocks)-x.max:]
	}
	for _, h := range blocks {
		if _, ok := p.spec[h]; ok {
			delete(p.spec, h)
			x.holderRemoveSpec(h, p.id)
		}
		if i, ok := p.at[h]; ok {
			p.unlink(i)
			p.pushFront(i)
			continue
		}
		if len(p.at) >= x.max {
			t := p.tail
			old := p.nodes[t].hash
			p.unlink(t)
			delete(p.at, old)
			p.release(t)
			x.holderRemove(old, p.id)
		}
		i := p.alloc(h)
		p.pushFront(i)
		p.at[h] = i
		x.holderAdd(h, p.id)
	}
}

// Remove forgets blocks the peer evicted. Unknown blocks are ignored.
func (x *Index) Remove(peer string, blocks []uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	id, ok := x.ids[peer]
	if !ok {
		return
	}
	p := x.peers[id]
	for _, h := range blocks {
		if i, ok := p.at[h]; ok {
			p.unlink(i)
			delete(p.at, h)
			p.release(i)
			x.holderRemove(h, p.id)
		}
	}
}

// Replace sets the peer's confirmed residency to blocks (a full snapshot, least recent first;
// past the cap only the last MaxBlocksPerPeer are kept). Speculative entries stay until they
// expire or are confirmed.
func (x *Index) Replace(peer string, blocks []uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	p := x.peerLocked(peer)
	x.clearConfirmedLocked(p)
	x.addLocked(p, blocks)
}

func (x *Index) clearConfirmedLocked(p *peer) {
	for h := range p.at {
		x.holderRemove(h, p.id)
	}
	clear(p.at)
	p.nodes = p.nodes[:0]
	p.head, p.tail, p.freeNode = -1, -1, -1
}

// DropPeer forgets everything about peer (it died, left or restarted).
func (x *Index) DropPeer(peer string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	id, ok := x.ids[peer]
	if !ok {
		return
	}
	p := x.peers[id]
	x.clearConfirmedLocked(p)
	for h := range p.spec {
		x.holderRemoveSpec(h, id)
	}
	delete(x.ids, peer)
	x.peers[id] = nil
	x.free = append(x.free, id)
}

// AddSpeculative records that an ingress just sent a prompt whose chain, from block 0, is
// blocks to peer: its anchors (all a lookup consults) count in lookups until expires, then
// vanish. Anchors the peer already confirmed are left as they are.
func (x *Index) AddSpeculative(peer string, blocks []uint64, expires time.Time) {
	if len(blocks) == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	p := x.peerLocked(peer)
	if p.spec == nil {
		p.spec = make(map[uint64]time.Time)
	}
	for pos := 0; pos < len(blocks); pos = nextAnchor(pos) {
		h := blocks[pos]
		if _, ok := p.at[h]; ok {
			continue
		}
		if _, ok := p.spec[h]; ok {
			x.holderRemoveSpec(h, p.id)
		}
		p.spec[h] = expires
		p.specQ = append(p.specQ, specEntry{h, expires})
		hs := x.holders[h]
		if hs == nil {
			hs = &holderSet{}
			x.holders[h] = hs
		}
		hs.spec = append(hs.spec, specHolder{p.id, expires})
	}
	x.trimSpecLocked(p, time.Time{})
}

// Expire drops speculative entries that expired at or before now. Lookups already ignore
// them; this frees their memory.
func (x *Index) Expire(now time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, p := range x.peers {
		if p != nil {
			x.trimSpecLocked(p, now)
		}
	}
}

// trimSpecLocked pops the FIFO while it is over the cap or its front expired (zero now: cap only).
func (x *Index) trimSpecLocked(p *peer, now time.Time) {
	n := 0
	for n < len(p.specQ) {
		e := p.specQ[n]
		exp, ok := p.spec[e.hash]
		if ok && !exp.Equal(e.expires) {
			n++ // superseded by a later AddSpeculative; the later entry owns it
			continue
		}
		if ok && len(p.spec) <= x.max && (now.IsZero() || exp.After(now)) {
			break
		}
		if ok {
			delete(p.spec, e.hash)
			x.holderRemoveSpec(e.hash, p.id)
		}
		n++
	}
	p.specQ = p.specQ[n:]
	if len(p.specQ) > 2*len(p.spec)+64 {
		// Compact stale FIFO entries left by refreshes so the queue stays bounded.
		q := p.specQ[:0:0]
		for _, e := range p.specQ {
			if exp, ok := p.spec[e.hash]; ok && exp.Equal(e.expires) {
				q = append(q, e)
			}
		}
		p.specQ = q
	}
}

// PeerBlocks returns how many confirmed blocks peer holds.
func (x *Index) PeerBlocks(peer string) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if id, ok := x.ids[peer]; ok {
		return len(x.peers[id].at)
	}
	return 0
}

// Peers returns the names of every peer with any residency, sorted.
func (x *Index) Peers() []string {
	x.mu.RLock()
	defer x.mu.RUnlock()
	out := make([]string, 0, len(x.ids))
	for n := range x.ids {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// AppendPeerBlocks appends peer's confirmed blocks to dst, least recent first, so that
// Replace(peer, AppendPeerBlocks(nil, peer)) reproduces the same residency and LRU order.
func (x *Index) AppendPeerBlocks(dst []uint64, peer string) []uint64 {
	x.mu.RLock()
	defer x.mu.RUnlock()
	id, ok := x.ids[peer]
	if !ok {
		return dst
	}
	p := x.peers[id]
	for i := p.tail; i >= 0; i = p.nodes[i].prev {
		dst = append(dst, p.nodes[i].hash)
	}
	return dst
}

// LongestPrefix appends to dst, for every peer holding blocks[0] (confirmed, or speculative
// and unexpired at now), the length of its anchored run: blocks is a prompt's chain from block
// 0, and only its anchors (Anchor) are consulted, so a peer's match is one past the last anchor
// of its contiguous run of anchors from block 0; blocks after that anchor are not counted.
// Results are longest first (ties by name); peers without block 0 are not listed. It walks the
// anchors once, intersecting the set of still-matching peers with each anchor's holders, so its
// cost grows with the matched anchors and the number of peers/64, not with peers × blocks.
func (x *Index) LongestPrefix(blocks []uint64, now time.Time, dst []Match) []Match {
	if len(blocks) == 0 {
		return dst
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	hs := x.holders[blocks[0]]
	if hs == nil {
		return dst
	}
	words := (len(x.peers) + 63) / 64
	s := x.scratch.Get().(*scratch)
	defer x.scratch.Put(s)
	if cap(s.active) < words {
		s.active = make([]uint64, words)
		s.keep = make([]uint64, words)
	}
	active, keep := s.active[:words], s.keep[:words]
	for w := range active {
		active[w] = ^uint64(0)
	}
	start := len(dst)
	if !hs.intersect(active, keep, now) {
		return dst
	}
	copy(active, keep)
	matched := 1 // the anchored length of the peers still active
	for pos := nextAnchor(0); pos < len(blocks); pos = nextAnchor(pos) {
		hit := false
		if hs = x.holders[blocks[pos]]; hs != nil {
			hit = hs.intersect(active, keep, now)
		} else {
			clear(keep)
		}
		for w := range active {
			for d := active[w] &^ keep[w]; d != 0; d &= d - 1 {
				id := w*64 + bits.TrailingZeros64(d)
				dst = append(dst, Match{Peer: x.peers[id].name, Blocks: matched})
			}
			active[w] = keep[w]
		}
		if !hit {
			break
		}
		matched = pos + 1
	}
	for w := range active {
		for d := active[w]; d != 0; d &= d - 1 {
			id := w*64 + bits.TrailingZeros64(d)
			dst = append(dst, Match{Peer: x.peers[id].name, Blocks: matched})
		}
	}
	slices.SortFunc(dst[start:], func(a, b Match) int {
		if a.Blocks != b.Blocks {
			return b.Blocks - a.Blocks
		}
		return strings.Compare(a.Peer, b.Peer)
	})
	return dst
}

func (p *peer) alloc(h uint64) int32 {
	if i := p.freeNode; i >= 0 {
		p.freeNode = p.nodes[i].next
		p.nodes[i] = lruNode{hash: h, prev: -1, next: -1}
		return i
	}
	p.nodes = append(p.nodes, lruNode{hash: h, prev: -1, next: -1})
	return int32(len(p.nodes) - 1)
}

func (p *peer) release(i int32) {
	p.nodes[i] = lruNode{prev: -1, next: p.freeNode}
	p.freeNode = i
}

func (p *peer) pushFront(i int32) {
	n := &p.nodes[i]
	n.prev, n.next = -1, p.head
	if p.head >= 0 {
		p.nodes[p.head].prev = i
	}
	p.head = i
	if p.tail < 0 {
		p.tail = i
	}
}

func (p *peer) unlink(i int32) {
	n := p.nodes[i]
	if n.prev >= 0 {
		p.nodes[n.prev].next = n.next
	} else {
		p.head = n.next
	}
	if n.next >= 0 {
		p.nodes[n.next].prev = n.prev
	} else {
		p.tail = n.prev
	}
}

// MaxBlocksPerPeer returns the per-peer cap in force.
func (x *Index) MaxBlocksPerPeer() int { return x.max }

// Heap cost of the index's entries, measured on Go 1.26 (amd64) by BenchmarkIndexMemory: a
// confirmed (peer, block) entry costs its LRU node and its place in the peer's map; a distinct
// block hash its holder set; a speculative entry its map slot, FIFO entry and holder entry.
const (
	EntryBytes     = 48
	DistinctBytes  = 112
	SpecEntryBytes = 160
)

// IndexStats is an Index's size.
type IndexStats struct {
	Peers       int // peers with any entry
	Blocks      int // confirmed (peer, block) entries, at most Peers × MaxBlocksPerPeer
	Speculative int // speculative (peer, block) entries, at most Peers × MaxBlocksPerPeer
	Distinct    int // distinct block hashes held by any peer
	// Bytes estimates the heap the entries hold: Blocks × EntryBytes + Distinct ×
	// DistinctBytes + Speculative × SpecEntryBytes. One peer at the cap, sharing no block with
	// another, is MaxBlocksPerPeer × (EntryBytes + DistinctBytes): 10 MiB at the default.
	Bytes int64
}

// Stats returns the index's size. It costs one pass over the peers, not over their blocks.
func (x *Index) Stats() IndexStats {
	x.mu.RLock()
	defer x.mu.RUnlock()
	s := IndexStats{Peers: len(x.ids), Distinct: len(x.holders)}
	for _, p := range x.peers {
		if p != nil {
			s.Blocks += len(p.at)
			s.Speculative += len(p.spec)
		}
	}
	s.Bytes = int64(s.Blocks)*EntryBytes + int64(s.Distinct)*DistinctBytes + int64(s.Speculative)*SpecEntryBytes
	return s
}
