package kvindex

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// SummaryVersion is the version byte of the summary encoding.
const SummaryVersion = 1

// MaxSummaryBlocks bounds the blocks one decoded summary may carry (8 MiB of hashes), so a
// hostile count cannot make the decoder allocate without limit.
const MaxSummaryBlocks = 1 << 20

const (
	kindDelta    = 0
	kindSnapshot = 1
)

// Decoding errors.
var (
	// ErrMalformed: truncated, trailing bytes, an unknown kind, a non-canonical varint or an
	// absurd count.
	ErrMalformed = errors.New("kvindex: malformed summary")
	// ErrVersion: a version this build does not speak.
	ErrVersion = errors.New("kvindex: unknown summary version")
)

// Summary is one prefix summary a node publishes about its own engine: a delta (blocks added
// and evicted since the previous one) or a snapshot (Added is the full residency, least recent
// first; Evicted is empty). Seq orders a node's summaries.
type Summary struct {
	Snapshot bool
	Seq      uint64
	Added    []uint64
	Evicted  []uint64
}

// Wire format: version byte, kind byte (0 delta, 1 snapshot), uvarint Seq, uvarint len(Added),
// uvarint len(Evicted), then each hash as 8 little-endian bytes, Added first. Hashes are
// uniformly random, so fixed width is as small as any varint scheme.

// EncodedLen returns the exact size of s's encoding.
func (s Summary) EncodedLen() int {
	return 2 + uvarintLen(s.Seq) + uvarintLen(uint64(len(s.Added))) + uvarintLen(uint64(len(s.Evicted))) +
		8*(len(s.Added)+len(s.Evicted))
}

// AppendBinary appends s's encoding to b. A snapshot with evictions is an error.
func (s Summary) AppendBinary(b []byte) ([]byte, error) {
	if s.Snapshot && len(s.Evicted) > 0 {
		return b, fmt.Errorf("%w: snapshot with evictions", ErrMalformed)
	}
	if len(s.Added) > MaxSummaryBlocks || len(s.Evicted) > MaxSummaryBlocks {
		return b, fmt.Errorf("%w: more than %d blocks", ErrMalformed, MaxSummaryBlocks)
	}
	kind := byte(kindDelta)
	if s.Snapshot {
		kind = kindSnapshot
	}
	b = append(b, SummaryVersion, kind)
	b = binary.AppendUvarint(b, s.Seq)
	b = binary.AppendUvarint(b, uint64(len(s.Added)))
	b = binary.AppendUvarint(b, uint64(len(s.Evicted)))
	for _, h := range s.Added {
		b = binary.LittleEndian.AppendUint64(b, h)
	}
	for _, h := range s.Evicted {
		b = binary.LittleEndian.AppendUint64(b, h)
	}
	return b, nil
}

// MarshalBinary returns s's encoding.
func (s Summary) MarshalBinary() ([]byte, error) {
	return s.AppendBinary(make([]byte, 0, s.EncodedLen()))
}

// DecodeSummary decodes one summary that fills b exactly. It never panics on any input.
func DecodeSummary(b []byte) (Summary, error) {
	var s Summary
	if len(b) < 2 {
		return s, fmt.Errorf("%w: %d bytes", ErrMalformed, len(b))
	}
	if b[0] != SummaryVersion {
		return s, fmt.Errorf("%w %d", ErrVersion, b[0])
	}
	switch b[1] {
	case kindDelta:
	case kindSnapshot:
		s.Snapshot = true
	default:
		return s, fmt.Errorf("%w: kind %d", ErrMalformed, b[1])
	}
	b = b[2:]
	var nAdd, nEv uint64
	var ok bool
	if s.Seq, b, ok = readUvarint(b); !ok {
		return Summary{}, fmt.Errorf("%w: seq", ErrMalformed)
	}
	if nAdd, b, ok = readUvarint(b); !ok {
		return Summary{}, fmt.Errorf("%w: added count", ErrMalformed)
	}
	if nEv, b, ok = readUvarint(b); !ok {
		return Summary{}, fmt.Errorf("%w: evicted count", ErrMalformed)
	}
	if nAdd > MaxSummaryBlocks || nEv > MaxSummaryBlocks {
		return Summary{}, fmt.Errorf("%w: counts %d+%d", ErrMalformed, nAdd, nEv)
	}
	if s.Snapshot && nEv > 0 {
		return Summary{}, fmt.Errorf("%w: snapshot with evictions", ErrMalformed)
	}
	if uint64(len(b)) != 8*(nAdd+nEv) {
		return Summary{}, fmt.Errorf("%w: %d bytes for %d hashes", ErrMalformed, len(b), nAdd+nEv)
	}
	s.Added = readHashes(b[:8*nAdd])
	s.Evicted = readHashes(b[8*nAdd:])
	return s, nil
}

func readHashes(b []byte) []uint64 {
	if len(b) == 0 {
		return nil
	}
	out := make([]uint64, len(b)/8)
	for i := range out {
		out[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return out
}

// readUvarint reads a canonical (shortest-form) uvarint, so every value has one encoding.
func readUvarint(b []byte) (uint64, []byte, bool) {
	v, n := binary.Uvarint(b)
	if n <= 0 || n != uvarintLen(v) {
		return 0, b, false
	}
	return v, b[n:], true
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}
