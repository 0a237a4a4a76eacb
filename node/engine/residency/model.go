package residency

import (
	"errors"
	"fmt"

	"github.com/kvmesh/kvmesh/kvindex"
)

// MaxBlocks bounds a Model's capacity: 2^20 blocks of 16 tokens are 16M tokens of KV, more than
// one engine holds, at about 100 bytes of memory a block.
const MaxBlocks = 1 << 20

// Model is the shadow of one engine's prefix cache. See the package doc.
type Model struct {
	blockTokens int
	capacity    int
	entries     map[uint64]*entry
	// The unpinned entries, least recently used first: evictions take the head. Stamps rise
	// from head to tail.
	head, tail *entry
	unpinned   int    // entries listed: those no running request holds
	reserved   int    // blocks the running requests hold outside the cache (partial and output)
	clock      uint64 // the last stamp given
	epoch      uint64 // bumped by Clear
}

type entry struct {
	hash       uint64
	pos        int    // its place in the chain it entered from, for kvindex.Anchor
	refs       int    // running requests holding it; listed only at 0
	stamp      uint64 // when it was last used
	prev, next *entry
	listed     bool
}

// Delta is what a change did to the model: the hashes that entered it and those that left it,
// in order, and the anchors among them (by each block's place in the chain it entered from).
// A caller reuses one by resetting it.
type Delta = kvindex.CacheDelta

// ErrConfig is returned by New for a non-positive capacity or block size.
var ErrConfig = errors.New("residency: invalid config")

// New returns an empty model of capacity blocks (at most MaxBlocks) of blockTokens tokens.
func New(capacity, blockTokens int) (*Model, error) {
	if capacity <= 0 || blockTokens <= 0 {
		return nil, fmt.Errorf("%w: capacity %d, block tokens %d", ErrConfig, capacity, blockTokens)
	}
	return &Model{blockTokens: blockTokens, capacity: min(capacity, MaxBlocks), entries: map[uint64]*entry{}}, nil
}

// BlockTokens is the block size, in kvmesh tokens.
func (m *Model) BlockTokens() int { return m.blockTokens }

// Capacity is the most blocks the model holds (running requests' pinned blocks may exceed it
// for as long as they run, as they do in an engine that cannot evict them).
func (m *Model) Capacity() int { return m.capacity }

// Len is how many blocks the model holds.
func (m *Model) Len() int { return len(m.entries) }

// SetCapacity changes the capacity (clamped to 1..MaxBlocks); shrinking evicts the least
// recently used blocks into d.
func (m *Model) SetCapacity(capacity int, d *Delta) {
	m.capacity = min(max(capacity, 1), MaxBlocks)
	m.makeRoom(0, d)
}

// Prediction is the model's guess, at dispatch, of how much of one prompt the engine holds.
type Prediction struct {
	// Blocks is the run of the prompt's blocks the model holds, contiguous from block 0, and
	// Tokens the same in kvmesh tokens.
	Blocks, Tokens int
	stamps         []uint64 // each predicted block's stamp when predicted
	epoch          uint64
}

// Predict returns how many of blocks, contiguous from block 0, the model holds, at most
// (promptTokens−1)/BlockTokens: an engine always computes at least one prompt token, so it
// never reports a whole prompt as cached.
func (m *Model) Predict(blocks []uint64, promptTokens int) Prediction {
	p := Prediction{epoch: m.epoch}
	limit := min(len(blocks), max(promptTokens-1, 0)/m.blockTokens)
	for _, h := range blocks[:limit] {
		e, ok := m.entries[h]
		if !ok {
			break
		}
		p.stamps = append(p.stamps, e.stamp)
	}
	p.Blocks = len(p.stamps)
	p.Tokens = p.Blocks * m.blockTokens
	return p
}

// Hold is one running request's blocks, pinned from Acquire to Release.
type Hold struct {
	blocks   []uint64
	private  int // blocks it holds outside the cache: its partial block, then its output
	epoch    uint64
	released bool
}

// Acquire records that the engine computed a prompt of promptTokens tokens whose full blocks
// are blocks: each enters the model or is refreshed, and is pinned until Release. The partial
// last block takes room too; least recently used blocks make way, into d.
func (m *Model) Acquire(blocks []uint64, promptTokens int, d *Delta) *Hold {
	h := &Hold{blocks: blocks, private: m.privateBlocks(len(blocks), promptTokens), epoch: m.epoch}
	m.reserved += h.private
	for i := len(blocks) - 1; i >= 0; i-- {
		e := m.touch(blocks[i], i, d)
		e.refs++
		m.unlist(e)
	}
	m.makeRoom(0, d)
	return h
}

// Release ends h's request after totalTokens tokens (prompt and output): its output took room
// while it ran (least recently used blocks made way, into d), then its blocks become evictable,
// the last block least recent. It does nothing for a hold released already or acquired before
// a Clear.
func (m *Model) Release(h *Hold, totalTokens int, d *Delta) {
	if h == nil || h.released {
		return
	}
	h.released = true
	if h.epoch != m.epoch {
		return
	}
	if peak := m.privateBlocks(len(h.blocks), totalTokens); peak > h.private {
		m.makeRoom(peak-h.private, d)
	}
	m.reserved -= h.private
	for i := len(h.blocks) - 1; i >= 0; i-- {
		e, ok := m.entries[h.blocks[i]]
		if !ok { // cannot happen: a pinned block is evicted only by Clear
			continue
		}
		e.refs--
		m.clock++
		e.stamp = m.clock
		if e.refs == 0 {
			m.list(e)
		}
	}
	m.makeRoom(0, d)
}

// privateBlocks is how many blocks a sequence of tokens holds beyond its full blocks hashed.
func (m *Model) privateBlocks(full, tokens int) int {
	return max(0, (tokens+m.blockTokens-1)/m.blockTokens-full)
}

// Report is what an engine said about one request's prompt.
type Report struct {
	// PromptTokens is the engine's count of the prompt (usage.prompt_tokens); 0 when it gave
	// none, and kvmesh's count stands in.
	PromptTokens int
	// CachedTokens is usage.prompt_tokens_details.cached_tokens.
	CachedTokens int
	// EngineBlockTokens is the engine's KV block size in its tokens; 0 means BlockTokens.
	EngineBlockTokens int
}

// Outcome is one prediction judged against the engine's report.
type Outcome struct {
	// In the engine's tokens: the prompt, the prediction as the engine would report it
	// (scaled, capped below the prompt and rounded down to the engine's block), and the report.
	PromptTokens, PredictedTokens, ReportedTokens int
	// Dropped is how many blocks the correction evicted, Added how many it stored.
	Dropped, Added int
}

// ErrorRatio is |predicted − reported| ÷ prompt tokens, 0..1.
func (o Outcome) ErrorRatio() float64 {
	if o.PromptTokens <= 0 {
		return 0
	}
	d := o.PredictedTokens - o.ReportedTokens
	if d < 0 {
		d = -d
	}
	return min(1, float64(d)/float64(o.PromptTokens))
}

// Correct judges p, the prediction for a prompt of promptTokens kvmesh tokens whose full blocks
// are blocks, against the engine's report r, and corrects the model into d: a shortfall evicts
// what the engine evidently lost, an excess stores what it evidently held (see the package
// doc). A prediction from before a Clear is judged but corrects nothing.
func (m *Model) Correct(p Prediction, blocks []uint64, promptTokens int, r Report, d *Delta) Outcome {
	if promptTokens <= 0 {
		return Outcome{}
	}
	promptE := r.PromptTokens
	if promptE <= 0 {
		promptE = promptTokens
	}
	eb := r.EngineBlockTokens
	if eb <= 0 {
		eb = m.blockTokens
	}
	pred := min(p.Tokens*promptE/promptTokens, promptE-1)
	pred = max(0, pred/eb*eb)
	reported := min(max(r.CachedTokens, 0), promptE)
	o := Outcome{PromptTokens: promptE, PredictedTokens: pred, ReportedTokens: reported}
	if p.epoch != m.epoch {
		return o
	}
	// The reported prefix in kvmesh blocks, and the slack of two tokenisations' boundaries.
	held := min(len(blocks), reported*promptTokens/promptE/m.blockTokens)
	slack := 0
	if promptE != promptTokens {
		slack = eb
	}
	switch {
	case reported+slack < pred && held < p.Blocks:
		// The engine lacked block held. It evicts least recently used first, so whatever the
		// model last used no later than that block had gone too.
		o.Dropped = m.evictThrough(p.stamps[held], d)
	case held > p.Blocks:
		before := len(d.Stored)
		limit := min(held, max(promptTokens-1, 0)/m.blockTokens)
		for i := limit - 1; i >= 0; i-- {
			m.touch(blocks[i], i, d)
		}
		o.Added = len(d.Stored) - before
		m.makeRoom(0, d)
	}
	return o
}

// Clear empties the model (the engine restarted), every block into d.Evicted. Holds and
// predictions from before it change nothing afterwards.
func (m *Model) Clear(d *Delta) {
	for e := m.head; e != nil; e = e.next {
		d.Evict(e.hash, e.pos)
	}
	for _, e := range m.entries {
		if !e.listed {
			d.Evict(e.hash, e.pos)
		}
	}
	clear(m.entries)
	m.head, m.tail, m.reserved, m.unpinned = nil, nil, 0, 0
	m.epoch++
}

// EvictOldest evicts, into d, the n least recently used unpinned blocks (fewer if fewer are
// unpinned), and returns how many: the engine said it evicted that many.
func (m *Model) EvictOldest(n int, d *Delta) int {
	k := 0
	for ; k < n && m.head != nil; k++ {
		m.evict(m.head, d)
	}
	return k
}

// Cap evicts, into d, least recently used blocks until at most limit are unpinned, and returns
// how many: the engine said it holds no more than limit. Pinned blocks do not count, since a
// running request's blocks may be newer than what the engine said.
func (m *Model) Cap(limit int, d *Delta) int {
	return m.EvictOldest(m.unpinned-max(limit, 0), d)
}

// Resident appends every block the model holds to dst, least recently used first (those
// running requests pin last).
func (m *Model) Resident(dst []uint64) []uint64 { return m.resident(dst, false) }

// ResidentAnchors appends, in Resident's order, the blocks the model holds that are anchors of
// the chains they entered from (kvindex.Anchor): the residency gossip carries.
func (m *Model) ResidentAnchors(dst []uint64) []uint64 { return m.resident(dst, true) }

func (m *Model) resident(dst []uint64, anchors bool) []uint64 {
	for e := m.head; e != nil; e = e.next {
		if !anchors || kvindex.Anchor(e.pos) {
			dst = append(dst, e.hash)
		}
	}
	for h, e := range m.entries {
		if !e.listed && (!anchors || kvindex.Anchor(e.pos)) {
			dst = append(dst, h)
		}
	}
	return dst
}

// touch makes h, block pos of its chain, the most recently used block, adding it (into d) if
// absent. A block keeps the position it entered at: its chained hash fixes it.
func (m *Model) touch(h uint64, pos int, d *Delta) *entry {
	m.clock++
	e, ok := m.entries[h]
	if !ok {
		e = &entry{hash: h, pos: pos}
		m.entries[h] = e
		d.Store(h, pos)
	}
	e.stamp = m.clock
	if e.listed {
		m.unlist(e)
		m.list(e)
	} else if e.refs == 0 {
		m.list(e)
	}
	return e
}

// makeRoom evicts least recently used blocks, into d, until the model and the running
// requests' private blocks, plus extra, fit the capacity, or nothing evictable is left.
func (m *Model) makeRoom(extra int, d *Delta) {
	for m.head != nil && len(m.entries)+m.reserved+extra > m.capacity {
		m.evict(m.head, d)
	}
}

// evictThrough evicts, into d, every unpinned block last used no later than stamp, and
// returns how many.
func (m *Model) evictThrough(stamp uint64, d *Delta) int {
	n := 0
	for m.head != nil && m.head.stamp <= stamp {
		m.evict(m.head, d)
		n++
	}
	return n
}

func (m *Model) evict(e *entry, d *Delta) {
	m.unlist(e)
	delete(m.entries, e.hash)
	d.Evict(e.hash, e.pos)
}

// list appends e at the tail (most recently used).
func (m *Model) list(e *entry) {
	e.prev, e.next = m.tail, nil
	if m.tail != nil {
		m.tail.next = e
	} else {
		m.head = e
	}
	m.tail = e
	e.listed = true
	m.unpinned++
}

func (m *Model) unlist(e *entry) {
	if !e.listed {
		return
	}
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		m.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		m.tail = e.prev
	}
	e.prev, e.next, e.listed = nil, nil, false
	m.unpinned--
}
