package kvevents

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/vmihailenco/msgpack/v5"
)

// pack encodes v as msgpack, for building payloads the way the engines' encoders lay them out.
func pack(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDecodeBatchReadsEveryEngineShape decodes the batch and event layouts vLLM and SGLang
// have published, and keeps only what the node reads from each.
func TestDecodeBatchReadsEveryEngineShape(t *testing.T) {
	big := uint64(15760518052499183552) // above MaxInt64, as vLLM 0.10+ sends them
	tests := []struct {
		name    string
		payload any
		want    []Event
	}{
		{
			name: "SGLang and early vLLM: arrays, 5 fields, no medium",
			payload: []any{1.5, []any{
				[]any{"BlockStored", []any{1, 2}, nil, []any{10, 11, 12}, 16, nil},
				[]any{"BlockRemoved", []any{1}},
				[]any{"AllBlocksCleared"},
			}},
			want: []Event{{Kind: BlockStored, Hashes: []uint64{1, 2}, BlockSize: 16}, {Kind: BlockRemoved, Hashes: []uint64{1}}, {Kind: AllBlocksCleared}},
		},
		{
			name: "vLLM 0.10-0.22: medium, a rank, newer trailing fields",
			payload: []any{1.5, []any{
				[]any{"BlockStored", []any{big}, uint64(7), []any{1}, 32, nil, "GPU", "lora", []any{nil}, 0, "full_attention"},
				[]any{"BlockRemoved", []any{big}, "CPU", 0},
			}, 0, "some future field"},
			want: []Event{{Kind: BlockStored, Hashes: []uint64{big}, BlockSize: 32, Medium: "GPU"}, {Kind: BlockRemoved, Hashes: []uint64{big}, Medium: "CPU"}},
		},
		{
			name: "later vLLM: map events tagged by type, in any key order",
			payload: []any{2.0, []any{
				map[string]any{"block_hashes": []any{5}, "type": "BlockStored", "block_size": 16, "token_ids": []any{1, 2}, "medium": "GPU", "extra_keys": []any{[]any{"salt", []any{1}}}},
				map[string]any{"type": "BlockRemoved", "block_hashes": []any{5}, "medium": nil, "group_idx": 0},
				map[string]any{"type": "AllBlocksCleared"},
			}, nil},
			want: []Event{{Kind: BlockStored, Hashes: []uint64{5}, BlockSize: 16, Medium: "GPU"}, {Kind: BlockRemoved, Hashes: []uint64{5}}, {Kind: AllBlocksCleared}},
		},
		{
			name:    "a map batch",
			payload: map[string]any{"events": []any{[]any{"AllBlocksCleared"}}, "ts": 3, "data_parallel_rank": 1},
			want:    []Event{{Kind: AllBlocksCleared}},
		},
		{
			name:    "byte-string hashes fold to 64 bits; negative integers keep their bits",
			payload: []any{1.0, []any{[]any{"BlockRemoved", []any{[]byte("sha256-digest"), -2}}}},
			want:    []Event{{Kind: BlockRemoved, Hashes: []uint64{xxhash.Sum64([]byte("sha256-digest")), 1<<64 - 2}}},
		},
		{
			name:    "an unknown event type is kept as Unknown, its fields skipped",
			payload: []any{1.0, []any{[]any{"BlockPinned", []any{1}, map[string]any{"x": []any{1}}}, []any{"AllBlocksCleared"}}},
			want:    []Event{{Kind: Unknown}, {Kind: AllBlocksCleared}},
		},
		{
			name:    "no events",
			payload: []any{1.0, []any{}},
			want:    []Event{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := DecodeBatch(pack(t, tt.payload))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(b.Events, tt.want) {
				t.Errorf("events %+v, want %+v", b.Events, tt.want)
			}
		})
	}
}

// TestDecodeBatchRefusesMalformed: anything that is not a batch is an ErrMalformed, never a
// panic or a partial batch.
func TestDecodeBatchRefusesMalformed(t *testing.T) {
	// [0, [["AllBlocksCleared", [[[...]]]]]]: a trailing field, skipped, nested 10,000 deep.
	deep := append([]byte{0x92, 0x00, 0x91, 0x92, 0xb0}, "AllBlocksCleared"...)
	deep = append(deep, bytes.Repeat([]byte{0x91}, 10000)...)
	deep = append(deep, 0xc0)
	tests := []struct {
		name    string
		payload []byte
	}{
		{"empty", nil},
		{"not msgpack", []byte("HTTP/1.1 400 Bad Request\r\n")},
		{"a number", pack(t, 7)},
		{"a one-field batch", pack(t, []any{1.0})},
		{"ts not a number", pack(t, []any{"now", []any{}})},
		{"events not a list", pack(t, []any{1.0, "events"})},
		{"an event not a list", pack(t, []any{1.0, []any{7}})},
		{"an empty event", pack(t, []any{1.0, []any{[]any{}}})},
		{"a tag not a string", pack(t, []any{1.0, []any{[]any{1, []any{1}}}})},
		{"BlockStored too short", pack(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil}}})},
		{"BlockRemoved without hashes", pack(t, []any{1.0, []any{[]any{"BlockRemoved"}}})},
		{"a hash that is a list", pack(t, []any{1.0, []any{[]any{"BlockRemoved", []any{[]any{1}}}}})},
		{"a nil hash", pack(t, []any{1.0, []any{[]any{"BlockRemoved", []any{nil}}}})},
		{"a negative block size", pack(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{}, -16, nil}}})},
		{"a map event without a type", pack(t, []any{1.0, []any{map[string]any{"block_hashes": []any{1}}}})},
		{"a map BlockStored without hashes", pack(t, []any{1.0, []any{map[string]any{"type": "BlockStored"}}})},
		{"a map batch without events", pack(t, map[string]any{"ts": 1.0})},
		{"a map key not a string", pack(t, map[int]any{1: 2})},
		{"truncated", pack(t, []any{1.0, []any{[]any{"BlockRemoved", []any{1, 2, 3}}}})[:12]},
		{"trailing bytes", append(pack(t, []any{1.0, []any{}}), 0xc0)},
		{"an array claiming 2^32-1 elements", []byte{0x92, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff}},
		{"a tag claiming 2^32-1 bytes", []byte{0x92, 0x00, 0x91, 0x91, 0xdb, 0xff, 0xff, 0xff, 0xff}},
		{"nested without end", deep},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := DecodeBatch(tt.payload)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("err %v, want ErrMalformed", err)
			}
			if b.Events != nil {
				t.Errorf("a partial batch: %+v", b.Events)
			}
		})
	}
}

// TestEncodeBatchDecodes: what the Publisher sends is what a subscriber reads.
func TestEncodeBatchDecodes(t *testing.T) {
	in := []Event{
		{Kind: BlockRemoved, Hashes: []uint64{3, 1 << 63}, Medium: MediumGPU},
		{Kind: BlockStored, Hashes: []uint64{7, 8, 9}, BlockSize: 16, Medium: MediumGPU},
		{Kind: AllBlocksCleared},
		{Kind: BlockStored, Hashes: []uint64{}, BlockSize: 4},
	}
	at := time.Unix(1700000000, 500_000_000)
	b, err := DecodeBatch(EncodeBatch(at, in))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(b.Events, in) || b.Time != 1700000000.5 {
		t.Errorf("decoded %+v at %v, want %+v at 1700000000.5", b.Events, b.Time, in)
	}
}

// FuzzDecodeBatch: no payload panics the decoder, and whatever it accepts encodes and decodes
// to the same events.
func FuzzDecodeBatch(f *testing.F) {
	f.Add(EncodeBatch(time.Unix(1, 0), []Event{{Kind: BlockStored, Hashes: []uint64{1}, BlockSize: 16, Medium: MediumGPU}}))
	f.Add(pack(f, []any{1.0, []any{map[string]any{"type": "BlockRemoved", "block_hashes": []any{[]byte("h")}}}, 0}))
	f.Add(pack(f, map[string]any{"ts": 1, "events": []any{[]any{"AllBlocksCleared"}}}))
	f.Add([]byte{0x92, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := DecodeBatch(payload)
		if err != nil {
			return
		}
		again, err := DecodeBatch(EncodeBatch(time.Unix(0, 0), b.Events))
		if err != nil {
			t.Fatalf("re-encoded batch does not decode: %v", err)
		}
		if len(again.Events) != len(b.Events) {
			t.Fatalf("%d events, then %d", len(b.Events), len(again.Events))
		}
		for i := range b.Events {
			if want, got := normal(b.Events[i]), normal(again.Events[i]); !reflect.DeepEqual(got, want) {
				t.Fatalf("event %d: %+v, then %+v", i, want, got)
			}
		}
	})
}

// normal is what of e survives EncodeBatch: the fields of its kind, hashes never nil.
func normal(e Event) Event {
	switch e.Kind {
	case BlockStored:
	case BlockRemoved:
		e.BlockSize = 0
	default:
		return Event{Kind: e.Kind}
	}
	if e.Hashes == nil {
		e.Hashes = []uint64{}
	}
	return e
}
