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

// Message is one chat message as the prefix rule sees it.
type Message struct {
	Role    string
	Content string
}

// RenderChat appends the fixed rendering of a chat to dst: each message as
// "<|role|>\n" + content + "\n", then "<|assistant|>\n" to open the reply. A conversation's
// next turn (the reply and a new user message appended) renders to a text that starts with
// this one, so consecutive turns share their prefix blocks.
func RenderChat(dst []byte, msgs []Message) []byte {
	for _, m := range msgs {
		dst = append(dst, "<|"...)
		dst = append(dst, m.Role...)
		dst = append(dst, "|>\n"...)
		dst = append(dst, m.Content...)
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
