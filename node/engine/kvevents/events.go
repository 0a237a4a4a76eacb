package kvevents

import (
	"bytes"
	"errors"
	"fmt"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Kind is an event's type.
type Kind uint8

// The event kinds. Unknown is a type this version does not know (a newer engine's).
const (
	Unknown Kind = iota
	BlockStored
	BlockRemoved
	AllBlocksCleared
)

// Kinds lists every kind, for metric labels.
var Kinds = []Kind{BlockStored, BlockRemoved, AllBlocksCleared, Unknown}

// kindTags are the engines' type tags.
var kindTags = map[string]Kind{
	"BlockStored":      BlockStored,
	"BlockRemoved":     BlockRemoved,
	"AllBlocksCleared": AllBlocksCleared,
}

// String is the kind's metric label.
func (k Kind) String() string {
	switch k {
	case BlockStored:
		return "stored"
	case BlockRemoved:
		return "removed"
	case AllBlocksCleared:
		return "cleared"
	}
	return "unknown"
}

func (k Kind) tag() string {
	for tag, kind := range kindTags {
		if kind == k {
			return tag
		}
	}
	return "Unknown"
}

// MediumGPU is the medium of the engine's GPU cache (vLLM names others, such as "CPU", for
// offloaded tiers).
const MediumGPU = "GPU"

// Event is one change to an engine's prefix cache.
type Event struct {
	Kind Kind
	// Hashes are the engine's block hashes (BlockStored, BlockRemoved), over its token ids: an
	// integer hash as is, a byte-string hash (newer vLLM) folded to 64 bits.
	Hashes []uint64
	// BlockSize is the engine's block size in its tokens (BlockStored; 0 when not given).
	BlockSize int
	// Medium is where the blocks live ("GPU"; "" when the engine does not say).
	Medium string
}

// Batch is one published message: the events of one engine step, in order.
type Batch struct {
	// Seq is the publisher's sequence number, and Time its timestamp (seconds since the epoch).
	Seq  uint64
	Time float64
	// Events in the order the engine made them.
	Events []Event
	// Missed: messages before this one never arrived or could not be read (a sequence gap,
	// a decode error, or joining a stream already under way), so the events before it are
	// not all known.
	Missed bool
	// Restarted: the batch is a publisher's first, so its engine's cache was empty before it:
	// the sequence started over (a restarted engine), or the first batch read is numbered 0
	// (the node reads the engine from its start). Missed says whether batches of the new
	// publisher were lost before it.
	Restarted bool
}

// ErrMalformed wraps every decoding error.
var ErrMalformed = errors.New("kvevents: malformed event batch")

// maxDepth bounds the nesting of the values a batch skips (token ids, extra keys): nothing an
// engine sends nests deeper, and garbage must not recurse without end.
const maxDepth = 16

// DecodeBatch reads one msgpack payload: a KVEventBatch, as an array [ts, events, ...] or a
// map {"ts", "events", ...}, whose events are each a tagged array [tag, fields...] (vLLM up
// to 0.22, SGLang) or a map with the tag under "type" (later vLLM). Fields this version does
// not read, and trailing fields of newer versions, are skipped. Seq, Missed and Restarted
// are left zero.
func DecodeBatch(payload []byte) (Batch, error) {
	r := bytes.NewReader(payload)
	d := decoder{r: r, dec: msgpack.NewDecoder(r)}
	b, err := d.batch()
	if err == nil && r.Len() > 0 {
		err = fmt.Errorf("%d bytes after the batch", r.Len())
	}
	if err != nil {
		return Batch{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return b, nil
}

type decoder struct {
	r   *bytes.Reader
	dec *msgpack.Decoder
}

// container reads an array or a map header: its length (pairs, for a map) and which.
func (d *decoder) container() (n int, isMap bool, err error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, false, err
	}
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err = d.dec.DecodeArrayLen()
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err = d.dec.DecodeMapLen()
		isMap = true
	default:
		return 0, false, fmt.Errorf("want an array or a map, got code %#x", c)
	}
	if err != nil {
		return 0, false, err
	}
	// Every element takes a byte at least: a longer claim is a lie, not a reason to allocate.
	if n < 0 || n > d.r.Len() {
		return 0, false, fmt.Errorf("length %d beyond the %d bytes left", n, d.r.Len())
	}
	return n, isMap, nil
}

func (d *decoder) array() (int, error) {
	n, isMap, err := d.container()
	if err == nil && isMap {
		err = errors.New("want an array, got a map")
	}
	return n, err
}

// skip skips one value, at nesting depth depth.
func (d *decoder) skip(depth int) error {
	if depth > maxDepth {
		return errors.New("values nested too deep")
	}
	c, err := d.dec.PeekCode()
	if err != nil {
		return err
	}
	if !msgpcode.IsFixedArray(c) && !msgpcode.IsFixedMap(c) &&
		c != msgpcode.Array16 && c != msgpcode.Array32 && c != msgpcode.Map16 && c != msgpcode.Map32 {
		return d.dec.Skip() // a scalar: msgpack's Skip does not recurse
	}
	n, isMap, err := d.container()
	if isMap {
		n *= 2
	}
	for i := 0; i < n && err == nil; i++ {
		err = d.skip(depth + 1)
	}
	return err
}

func (d *decoder) skipN(n, depth int) error {
	for i := 0; i < n; i++ {
		if err := d.skip(depth); err != nil {
			return err
		}
	}
	return nil
}

func (d *decoder) batch() (Batch, error) {
	var b Batch
	n, isMap, err := d.container()
	if err != nil {
		return b, err
	}
	if !isMap {
		if n < 2 {
			return b, fmt.Errorf("a batch array of %d fields, want ts and events at least", n)
		}
		if b.Time, err = d.dec.DecodeFloat64(); err != nil {
			return b, fmt.Errorf("ts: %w", err)
		}
		if b.Events, err = d.events(); err != nil {
			return b, err
		}
		return b, d.skipN(n-2, 1) // data_parallel_rank, and whatever newer versions add
	}
	seen := false
	for range n {
		key, err := d.dec.DecodeString()
		if err != nil {
			return b, fmt.Errorf("batch key: %w", err)
		}
		switch key {
		case "ts":
			b.Time, err = d.dec.DecodeFloat64()
		case "events":
			b.Events, err = d.events()
			seen = true
		default:
			err = d.skip(1)
		}
		if err != nil {
			return b, fmt.Errorf("batch %s: %w", key, err)
		}
	}
	if !seen {
		return b, errors.New("a batch map without events")
	}
	return b, nil
}

func (d *decoder) events() ([]Event, error) {
	n, err := d.array()
	if err != nil {
		return nil, fmt.Errorf("events: %w", err)
	}
	out := make([]Event, 0, n)
	for i := range n {
		e, err := d.event()
		if err != nil {
			return nil, fmt.Errorf("event %d: %w", i, err)
		}
		out = append(out, e)
	}
	return out, nil
}

func (d *decoder) event() (Event, error) {
	n, isMap, err := d.container()
	if err != nil {
		return Event{}, err
	}
	if isMap {
		return d.eventMap(n)
	}
	if n < 1 {
		return Event{}, errors.New("an empty event")
	}
	tag, err := d.dec.DecodeString()
	if err != nil {
		return Event{}, fmt.Errorf("tag: %w", err)
	}
	e := Event{Kind: kindTags[tag]}
	rest := n - 1
	// The positional fields read, by kind: BlockStored [hashes, parent, token_ids, block_size,
	// lora_id, medium], BlockRemoved [hashes, medium].
	switch e.Kind {
	case BlockStored:
		if rest < 4 {
			return e, fmt.Errorf("BlockStored of %d fields, want 4 at least", rest)
		}
		if e.Hashes, err = d.hashes(); err != nil {
			return e, err
		}
		if err = d.skipN(2, 3); err != nil { // parent_block_hash, token_ids
			return e, err
		}
		if e.BlockSize, err = d.blockSize(); err != nil {
			return e, err
		}
		rest -= 4
		if rest >= 2 {
			if err = d.skip(3); err != nil { // lora_id
				return e, err
			}
			if e.Medium, err = d.optString(); err != nil {
				return e, err
			}
			rest -= 2
		}
	case BlockRemoved:
		if rest < 1 {
			return e, errors.New("BlockRemoved without block hashes")
		}
		if e.Hashes, err = d.hashes(); err != nil {
			return e, err
		}
		rest--
		if rest >= 1 {
			if e.Medium, err = d.optString(); err != nil {
				return e, err
			}
			rest--
		}
	}
	return e, d.skipN(rest, 3)
}

// eventMap reads an event encoded as a map of n pairs, its tag under "type".
func (d *decoder) eventMap(n int) (Event, error) {
	var e Event
	var tag string
	haveHashes := false
	for range n {
		key, err := d.dec.DecodeString()
		if err != nil {
			return e, fmt.Errorf("event key: %w", err)
		}
		switch key {
		case "type":
			tag, err = d.dec.DecodeString()
		case "block_hashes":
			e.Hashes, err = d.hashes()
			haveHashes = true
		case "block_size":
			e.BlockSize, err = d.blockSize()
		case "medium":
			e.Medium, err = d.optString()
		default:
			err = d.skip(3)
		}
		if err != nil {
			return e, fmt.Errorf("%s: %w", key, err)
		}
	}
	if tag == "" {
		return e, errors.New("an event map without a type")
	}
	e.Kind = kindTags[tag]
	if (e.Kind == BlockStored || e.Kind == BlockRemoved) && !haveHashes {
		return e, fmt.Errorf("%s without block_hashes", tag)
	}
	return e, nil
}

// hashes reads a list of block hashes: integers (signed or not) or byte strings.
func (d *decoder) hashes() ([]uint64, error) {
	n, err := d.array()
	if err != nil {
		return nil, fmt.Errorf("block hashes: %w", err)
	}
	out := make([]uint64, 0, n)
	for range n {
		c, err := d.dec.PeekCode()
		if err != nil {
			return nil, err
		}
		var h uint64
		switch {
		case msgpcode.IsBin(c) || msgpcode.IsString(c):
			var b []byte
			if b, err = d.dec.DecodeBytes(); err == nil {
				h = xxhash.Sum64(b)
			}
		case c == msgpcode.Nil:
			err = errors.New("nil")
		case c >= msgpcode.NegFixedNumLow, c >= msgpcode.Int8 && c <= msgpcode.Int64: // negative, or signed
			var v int64
			v, err = d.dec.DecodeInt64()
			h = uint64(v)
		default:
			h, err = d.dec.DecodeUint64()
		}
		if err != nil {
			return nil, fmt.Errorf("block hash: %w", err)
		}
		out = append(out, h)
	}
	return out, nil
}

func (d *decoder) blockSize() (int, error) {
	v, err := d.dec.DecodeInt64()
	if err != nil {
		return 0, fmt.Errorf("block size: %w", err)
	}
	if v < 0 || v > 1<<20 {
		return 0, fmt.Errorf("block size %d out of range", v)
	}
	return int(v), nil
}

// optString reads a string or nil ("").
func (d *decoder) optString() (string, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return "", err
	}
	if c == msgpcode.Nil {
		return "", d.dec.Skip()
	}
	return d.dec.DecodeString()
}

// EncodeBatch encodes events as vLLM's and SGLang's array-shaped KVEventBatch [ts, events],
// each event a tagged array: ["BlockStored", hashes, parent (nil), token_ids (empty),
// block_size, lora_id (nil), medium], ["BlockRemoved", hashes, medium], ["AllBlocksCleared"].
func EncodeBatch(ts time.Time, events []Event) []byte {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	// Writes to a bytes.Buffer do not fail.
	_ = enc.EncodeArrayLen(2)
	_ = enc.EncodeFloat64(float64(ts.UnixNano()) / 1e9)
	_ = enc.EncodeArrayLen(len(events))
	for _, e := range events {
		encodeEvent(enc, e)
	}
	return buf.Bytes()
}

func encodeEvent(enc *msgpack.Encoder, e Event) {
	medium := func() {
		if e.Medium == "" {
			_ = enc.EncodeNil()
		} else {
			_ = enc.EncodeString(e.Medium)
		}
	}
	hashes := func() {
		_ = enc.EncodeArrayLen(len(e.Hashes))
		for _, h := range e.Hashes {
			_ = enc.EncodeUint(h)
		}
	}
	switch e.Kind {
	case BlockStored:
		_ = enc.EncodeArrayLen(7)
		_ = enc.EncodeString(e.Kind.tag())
		hashes()
		_ = enc.EncodeNil()
		_ = enc.EncodeArrayLen(0)
		_ = enc.EncodeInt(int64(e.BlockSize))
		_ = enc.EncodeNil()
		medium()
	case BlockRemoved:
		_ = enc.EncodeArrayLen(3)
		_ = enc.EncodeString(e.Kind.tag())
		hashes()
		medium()
	default:
		_ = enc.EncodeArrayLen(1)
		_ = enc.EncodeString(e.Kind.tag())
	}
}
