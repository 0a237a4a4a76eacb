package scalemodel

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// IsAnchor reports whether the block at position pos of a prompt's chain is gossiped: pos+1 a
// power of two up to 64 (short prefixes stay visible at a few blocks' granularity), then every
// 64th block (a long prompt's reuse is found to within 1,024 tokens).
func IsAnchor(pos int) bool {
	p := pos + 1
	if p <= 0 {
		return false
	}
	return p%64 == 0 || (p < 64 && p&(p-1) == 0)
}

// DefaultAnchorFraction is the Fraction of the Mooncake conversation trace's blocks
// (/work/shared/traces/mooncake_conversation_trace.jsonl, 512-token ids, 16-token blocks):
// 87,025 anchors of 5,662,916 new blocks. TestTraceAnchorFraction recomputes it where the
// trace is present.
const DefaultAnchorFraction = 0.01537

// A trace record of the Mooncake format: one hash id a 512-token block, shared ids at the same
// position a shared prefix.
type traceRecord struct {
	InputLength int     `json:"input_length"`
	HashIDs     []int64 `json:"hash_ids"`
}

// TraceBlocks is what CountTraceBlocks counts: the trace's new 16-token blocks (those of a
// 512-token id the trace shows for the first time, up to the prompt's last full block) and
// how many of them are anchors.
type TraceBlocks struct {
	Requests, New, Anchors int
}

// Fraction is the share of new blocks that are anchors: a node gossips its engine's churn
// times this.
func (b TraceBlocks) Fraction() float64 {
	if b.New == 0 {
		return 0
	}
	return float64(b.Anchors) / float64(b.New)
}

// CountTraceBlocks reads a Mooncake-format trace, one JSON record a line, with hashTokens
// tokens a hash id and blockTokens a kvmesh block.
func CountTraceBlocks(trace io.Reader, hashTokens, blockTokens int) (TraceBlocks, error) {
	if hashTokens <= 0 || blockTokens <= 0 || hashTokens%blockTokens != 0 {
		return TraceBlocks{}, fmt.Errorf("%w: %d-token hash ids of %d-token blocks", ErrConfig, hashTokens, blockTokens)
	}
	per := hashTokens / blockTokens
	seen := map[int64]bool{}
	var b TraceBlocks
	dec := json.NewDecoder(trace)
	for {
		var r traceRecord
		if err := dec.Decode(&r); errors.Is(err, io.EOF) {
			return b, nil
		} else if err != nil {
			return b, fmt.Errorf("scalemodel: trace record %d: %w", b.Requests+1, err)
		}
		b.Requests++
		full := r.InputLength / blockTokens // a partial block is not hashed
		for j, id := range r.HashIDs {
			if seen[id] {
				continue
			}
			seen[id] = true
			for pos := j * per; pos < min((j+1)*per, full); pos++ {
				b.New++
				if IsAnchor(pos) {
					b.Anchors++
				}
			}
		}
	}
}
