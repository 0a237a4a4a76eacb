package kvindex

import (
	"bytes"
	"errors"
	"slices"
	"testing"
)

func TestSummaryRoundTrip(t *testing.T) {
	tests := []Summary{
		{},
		{Seq: 1 << 40, Added: []uint64{1, 2, 1 << 63}, Evicted: []uint64{7}},
		{Snapshot: true, Seq: 3, Added: seq(0, 500)},
		{Evicted: []uint64{0}},
	}
	for _, s := range tests {
		b, err := s.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != s.EncodedLen() {
			t.Fatalf("EncodedLen %d, encoded %d", s.EncodedLen(), len(b))
		}
		got, err := DecodeSummary(b)
		if err != nil {
			t.Fatalf("decode %+v: %v", s, err)
		}
		if got.Snapshot != s.Snapshot || got.Seq != s.Seq || !slices.Equal(got.Added, s.Added) || !slices.Equal(got.Evicted, s.Evicted) {
			t.Fatalf("round trip: %+v != %+v", got, s)
		}
	}
	if _, err := (Summary{Snapshot: true, Evicted: []uint64{1}}).MarshalBinary(); !errors.Is(err, ErrMalformed) {
		t.Fatalf("snapshot with evictions encoded: %v", err)
	}
}

func TestDecodeSummaryMalformed(t *testing.T) {
	good, _ := Summary{Seq: 5, Added: []uint64{1, 2}, Evicted: []uint64{3}}.MarshalBinary()
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, ErrMalformed},
		{"one byte", []byte{1}, ErrMalformed},
		{"version 2", append([]byte{2}, good[1:]...), ErrVersion},
		{"version 0", append([]byte{0}, good[1:]...), ErrVersion},
		{"unknown kind", append([]byte{1, 9}, good[2:]...), ErrMalformed},
		{"truncated", good[:len(good)-1], ErrMalformed},
		{"trailing", append(slices.Clone(good), 0), ErrMalformed},
		{"absurd count", []byte{1, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f, 0}, ErrMalformed},
		{"count beyond bytes", []byte{1, 0, 0, 100, 0, 1, 2, 3}, ErrMalformed},
		{"non-canonical varint", []byte{1, 0, 0x80, 0x00, 0, 0}, ErrMalformed},
		{"overlong varint", []byte{1, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0, 0}, ErrMalformed},
		{"snapshot with evictions", []byte{1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}, ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := DecodeSummary(tt.in); !errors.Is(err, tt.want) {
				t.Fatalf("DecodeSummary(%x) = %v, want %v", tt.in, err, tt.want)
			}
		})
	}
}

func FuzzDecodeSummary(f *testing.F) {
	for _, s := range []Summary{{}, {Seq: 9, Added: []uint64{1}, Evicted: []uint64{2, 3}}, {Snapshot: true, Added: seq(0, 3)}} {
		b, _ := s.MarshalBinary()
		f.Add(b)
	}
	f.Add([]byte{1, 0, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeSummary(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrVersion) {
				t.Fatalf("unexpected error class: %v", err)
			}
			return
		}
		// The encoding is canonical: whatever decodes re-encodes to the same bytes.
		out, err := s.MarshalBinary()
		if err != nil || !bytes.Equal(out, b) {
			t.Fatalf("re-encode %x != %x (%v)", out, b, err)
		}
	})
}
