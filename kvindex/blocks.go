package kvindex

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// BytesPerToken is kvmesh's tokenisation rule: every 4 bytes of UTF-8 prompt text are one token
// (the last token may be shorter). It is deterministic, needs no vocabulary, and is close to the
// ~4 characters per token of real BPE tokenisers on English text. The embedded engine, the
// admission budget and the prefix index all count tokens with it.
const BytesPerToken = 4

// DefaultBlockTokens is the default KV block size in tokens (vLLM's default block size).
const DefaultBlockTokens = 16

// Tokens returns the number of tokens in n bytes of text.
func Tokens(n int) int { return (n + BytesPerToken - 1) / BytesPerToken }

// Message is one chat message as the prefix rule sees it: its text, and its images and audio
// clips with their places in it.
type Message struct {
	Role    string
	Content string
	Parts   []Part
}

// RenderChat appends the fixed rendering of a chat to dst: each message as
// "<|role|>\n" + content + "\n", then "<|assistant|>\n" to open the reply, a message's
// parts rendered in its content at their places (Part). A conversation's next turn (the reply
// and a new user message appended) renders to a text that starts with this one, so
// consecutive turns share their prefix blocks.
func RenderChat(dst []byte, msgs []Message) []byte {
	for _, m := range msgs {
		dst = append(dst, "<|"...)
		dst = append(dst, m.Role...)
		dst = append(dst, "|>\n"...)
		dst = appendContent(dst, m)
		dst = append(dst, '\n')
	}
	return append(dst, "<|assistant|>\n"...)
}

// Seed is the chain value before block 0: the hash of the model name, so equal text under two
// models never shares blocks.
func Seed(model string) uint64 { return xxhash.Sum64String(model) }

// AppendBlocks appends to dst the chained hashes of every full block of prompt under model:
// h_i = xxhash(h_{i-1} as 8 little-endian bytes || block_i), h_{-1} = Seed(model). A trailing
// partial block is not hashed: an engine can only reuse full blocks. blockTokens ≤ 0 means
// DefaultBlockTokens.
func AppendBlocks(dst []uint64, model string, prompt []byte, blockTokens int) []uint64 {
	if blockTokens <= 0 {
		blockTokens = DefaultBlockTokens
	}
	size := blockTokens * BytesPerToken
	// One buffer holds h_{i-1} and block i, so each block is a single one-shot Sum64: the
	// streaming Digest's per-call overhead dominates on 64-byte blocks.
	var stack [8 + 256]byte
	buf := stack[:]
	if 8+size > len(buf) {
		buf = make([]byte, 8+size)
	}
	buf = buf[:8+size]
	h := Seed(model)
	for off := 0; off+size <= len(prompt); off += size {
		binary.LittleEndian.PutUint64(buf[:8], h)
		copy(buf[8:], prompt[off:off+size])
		h = xxhash.Sum64(buf)
		dst = append(dst, h)
	}
	return dst
}

// Blocks returns the chained block hashes of prompt (see AppendBlocks).
func Blocks(model string, prompt []byte, blockTokens int) []uint64 {
	n := 0
	if blockTokens > 0 {
		n = len(prompt) / (blockTokens * BytesPerToken)
	}
	return AppendBlocks(make([]uint64, 0, n), model, prompt, blockTokens)
}

// AnchorStride is the spacing of anchors past a chain's head, in blocks. 64 blocks of 16
// tokens are 1,024 tokens, some 30 ms of an H100's prefill: the most a match past the head
// undercounts, small beside the seconds a long shared prefix saves, while gossip carries one
// block in 64 of a long prompt. It is a protocol constant: an index finds only the anchors its
// peers sent, so every node of a domain must agree on it.
const AnchorStride = 64

// Anchor reports whether chain position pos (block pos of a prompt, from 0) is an anchor, one
// of the blocks gossip carries and the index matches: pos+1 a power of two up to AnchorStride
// (0, 1, 3, 7, 15, 31, 63), so a short prompt loses at most half its match, or a multiple of
// it (127, 191, 255, ...).
func Anchor(pos int) bool {
	p := pos + 1
	if p <= 0 {
		return false
	}
	if p < AnchorStride {
		return p&(p-1) == 0
	}
	return p%AnchorStride == 0
}

// nextAnchor is the anchor position after anchor position pos.
func nextAnchor(pos int) int {
	if pos+1 < AnchorStride {
		return 2*pos + 1
	}
	return pos + AnchorStride
}

// AppendAnchors appends to dst the anchors of chain, a prompt's blocks from block 0.
func AppendAnchors(dst, chain []uint64) []uint64 {
	for pos := 0; pos < len(chain); pos = nextAnchor(pos) {
		dst = append(dst, chain[pos])
	}
	return dst
}

// AnchoredLen is the most a lookup can match of a chain of n blocks: one past its last anchor.
func AnchoredLen(n int) int {
	last := -1
	for pos := 0; pos < n; pos = nextAnchor(pos) {
		last = pos
	}
	return last + 1
}

// CacheDelta is one report of an engine's prefix cache: the block hashes it stored and
// evicted, in order, and the anchors among them (by each block's chain position), which are
// all gossip carries. A reporter reuses one by resetting it.
type CacheDelta struct {
	Stored, Evicted               []uint64
	StoredAnchors, EvictedAnchors []uint64
}

// Store records that block h, at chain position pos, entered the cache.
func (d *CacheDelta) Store(h uint64, pos int) {
	d.Stored = append(d.Stored, h)
	if Anchor(pos) {
		d.StoredAnchors = append(d.StoredAnchors, h)
	}
}

// Evict records that block h, at chain position pos, left the cache.
func (d *CacheDelta) Evict(h uint64, pos int) {
	d.Evicted = append(d.Evicted, h)
	if Anchor(pos) {
		d.EvictedAnchors = append(d.EvictedAnchors, h)
	}
}

// Reset empties d, keeping its storage.
func (d *CacheDelta) Reset() {
	d.Stored, d.Evicted = d.Stored[:0], d.Evicted[:0]
	d.StoredAnchors, d.EvictedAnchors = d.StoredAnchors[:0], d.EvictedAnchors[:0]
}

// Empty reports whether d holds no change.
func (d *CacheDelta) Empty() bool { return len(d.Stored) == 0 && len(d.Evicted) == 0 }
