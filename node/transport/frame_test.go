package transport

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

func TestHeaderRoundTrip(t *testing.T) {
	tests := []Header{
		{},
		{RequestID: "r", Hops: maxHops, Priority: -1 << 31, Deadline: time.Unix(0, 1)},
		{Tenant: "t", AgentID: "ü", Blocks: make([]uint64, MaxBlocks), Ingress: "a", Path: "/v1/completions",
			Meta: map[string]string{"a": strings.Repeat("v", maxMetaValue), "": ""}},
	}
	for i, h := range tests {
		p, err := EncodeHeader(nil, h)
		if err != nil {
			t.Fatalf("%d: encode: %v", i, err)
		}
		got, err := DecodeHeader(p)
		if err != nil {
			t.Fatalf("%d: decode: %v", i, err)
		}
		h.Version = Version
		if !reflect.DeepEqual(got, h) {
			t.Errorf("%d: round trip %+v, want %+v", i, got, h)
		}
	}
}

func TestHeaderRejects(t *testing.T) {
	valid, _ := EncodeHeader(nil, Header{RequestID: "r"})
	encodeTests := []struct {
		name string
		h    Header
		want error
	}{
		{"version", Header{Version: 2}, ErrVersion},
		{"hops", Header{Hops: maxHops + 1}, ErrMalformed},
		{"negative hops", Header{Hops: -1}, ErrMalformed},
		{"priority", Header{Priority: 1 << 40}, ErrMalformed},
		{"blocks", Header{Blocks: make([]uint64, MaxBlocks+1)}, ErrMalformed},
		{"meta entries", Header{Meta: bigMeta(MaxMeta + 1)}, ErrMalformed},
		{"long string", Header{Tenant: strings.Repeat("t", maxShortString+1)}, ErrMalformed},
		{"bad utf-8", Header{RequestID: "\xff"}, ErrMalformed},
	}
	for _, tt := range encodeTests {
		t.Run("encode "+tt.name, func(t *testing.T) {
			if _, err := EncodeHeader(nil, tt.h); !errors.Is(err, tt.want) {
				t.Errorf("EncodeHeader = %v, want %v", err, tt.want)
			}
		})
	}
	decodeTests := []struct {
		name string
		p    []byte
		want error
	}{
		{"empty", nil, ErrMalformed},
		{"version", append([]byte{2}, valid[1:]...), ErrVersion},
		{"trailing", append(append([]byte(nil), valid...), 0), ErrMalformed},
		{"truncated", valid[:len(valid)-1], ErrMalformed},
		{"huge string length", []byte{1, 0xff, 0xff, 0xff, 0xff, 0x0f}, ErrMalformed},
		{"blocks past the end", []byte{1, 0, 0, 0, 0, 0, 0, 5, 1, 2}, ErrMalformed},
		{"too many blocks", []byte{1, 0, 0, 0, 0, 0, 0, 0x81, 0x80, 0x04}, ErrMalformed},
		{"duplicate meta", []byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 1, 'k', 0, 1, 'k', 0}, ErrMalformed},
		{"too big", make([]byte, MaxHeaderBytes+1), ErrMalformed},
	}
	for _, tt := range decodeTests {
		t.Run("decode "+tt.name, func(t *testing.T) {
			if _, err := DecodeHeader(tt.p); !errors.Is(err, tt.want) {
				t.Errorf("DecodeHeader = %v, want %v", err, tt.want)
			}
		})
	}
}

func bigMeta(n int) map[string]string {
	m := make(map[string]string, n)
	for i := range n {
		m[strings.Repeat("k", i+1)] = ""
	}
	return m
}

func TestAnswerFrames(t *testing.T) {
	p, err := encodeAccept(200, map[string]string{"A": "b"})
	if err != nil {
		t.Fatal(err)
	}
	if s, h, err := decodeAccept(p); err != nil || s != 200 || h["A"] != "b" {
		t.Errorf("accept round trip: %d %v %v", s, h, err)
	}
	want := Refusal{Status: 503, Code: "no_capacity", Message: "m", RetryAfter: time.Second, State: []byte("s")}
	p, err = encodeRefuse(want)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := decodeRefuse(p); err != nil || !reflect.DeepEqual(*r, want) {
		t.Errorf("refuse round trip: %+v %v", r, err)
	}
	for _, msg := range []string{"", "boom", "\xff\xfe", strings.Repeat("é", maxShortString)} {
		got, err := decodeEnd(encodeEnd(msg))
		if err != nil || (msg == "") != (got == "") || len(got) > maxShortString {
			t.Errorf("end %q: %q %v", msg[:min(len(msg), 8)], got, err)
		}
	}
	bad := []struct {
		name string
		err  error
	}{
		{"accept status", func() error { _, err := encodeAccept(99, nil); return err }()},
		{"accept headers", func() error { _, err := encodeAccept(200, bigMeta(MaxMeta+1)); return err }()},
		{"refuse status", func() error { _, err := encodeRefuse(Refusal{Status: 600}); return err }()},
		{"refuse state", func() error {
			_, err := encodeRefuse(Refusal{Status: 429, State: make([]byte, MaxStateBytes+1)})
			return err
		}()},
		{"refuse retry", func() error { _, err := encodeRefuse(Refusal{Status: 429, RetryAfter: -1}); return err }()},
		{"end flag", func() error { _, err := decodeEnd([]byte{2}); return err }()},
		{"end empty message", func() error { _, err := decodeEnd([]byte{1, 0}); return err }()},
		{"accept trailing", func() error { _, _, err := decodeAccept([]byte{200, 1, 0, 0}); return err }()},
	}
	for _, tt := range bad {
		if !errors.Is(tt.err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", tt.name, tt.err)
		}
	}
}

func TestReadFrameLimits(t *testing.T) {
	tests := []struct {
		name  string
		wire  []byte
		limit int
		want  error
	}{
		{"clean eof", nil, 10, io.EOF},
		{"cut length", []byte{frameData, 0x80}, 10, io.ErrUnexpectedEOF},
		{"cut payload", []byte{frameData, 3, 'a'}, 10, io.ErrUnexpectedEOF},
		{"unknown type", []byte{42, 0}, 10, ErrMalformed},
		{"over caller limit", []byte{frameData, 11}, 10, ErrMalformed},
		{"over type limit", appendFrameHead(nil, frameAccept, MaxAnswerBytes+1), 1 << 30, ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := readFrame(bufio.NewReader(bytes.NewReader(tt.wire)), tt.limit)
			if !errors.Is(err, tt.want) {
				t.Errorf("readFrame = %v, want %v", err, tt.want)
			}
		})
	}
}

func FuzzDecodeHeader(f *testing.F) {
	for _, h := range []Header{{}, {RequestID: "r", Blocks: []uint64{1, 2}, Meta: map[string]string{"k": "v"}, Deadline: time.Unix(5, 0)}} {
		p, _ := EncodeHeader(nil, h)
		f.Add(p)
	}
	f.Add([]byte{1, 0xff})
	f.Fuzz(func(t *testing.T, p []byte) {
		h, err := DecodeHeader(p)
		if err != nil {
			return
		}
		// Whatever decodes must re-encode and decode to the same header.
		q, err := EncodeHeader(nil, h)
		if err != nil {
			t.Fatalf("re-encode of a decoded header: %v", err)
		}
		h2, err := DecodeHeader(q)
		if err != nil || !reflect.DeepEqual(h, h2) {
			t.Fatalf("round trip changed the header: %+v vs %+v (%v)", h, h2, err)
		}
	})
}

type nopCanceler struct{}

func (nopCanceler) CancelRead(quic.StreamErrorCode)  {}
func (nopCanceler) CancelWrite(quic.StreamErrorCode) {}

// FuzzReadFrame feeds arbitrary owner output to the answer parser and the response body
// reader, the code that reads bytes from a peer.
func FuzzReadFrame(f *testing.F) {
	accept, _ := encodeAccept(200, map[string]string{"a": "b"})
	refuse, _ := encodeRefuse(Refusal{Status: 429, Code: "c", State: []byte{1}})
	frame := func(typ byte, p []byte) []byte { return append(appendFrameHead(nil, typ, len(p)), p...) }
	f.Add(append(append(frame(frameAccept, accept), frame(frameData, []byte("hi"))...), frame(frameEnd, encodeEnd(""))...))
	f.Add(frame(frameRefuse, refuse))
	f.Add(append(frame(frameAccept, accept), frame(frameEnd, encodeEnd("boom"))...))
	f.Add([]byte{frameData, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, wire []byte) {
		br := bufio.NewReader(bytes.NewReader(wire))
		typ, p, err := readFrame(br, MaxAnswerBytes)
		if err != nil {
			return
		}
		if len(p) > MaxAnswerBytes {
			t.Fatalf("payload of %d bytes over the limit", len(p))
		}
		switch typ {
		case frameRefuse:
			if r, err := decodeRefuse(p); err == nil && (!validStatus(r.Status) || len(r.State) > MaxStateBytes) {
				t.Fatalf("accepted an invalid refusal %+v", r)
			}
		case frameAccept:
			if s, h, err := decodeAccept(p); err == nil && (!validStatus(s) || len(h) > MaxMeta) {
				t.Fatalf("accepted an invalid accept %d %v", s, h)
			}
			b := &respBody{str: nopCanceler{}, br: br, stop: func() bool { return true }, ctxErr: func() error { return nil }}
			n, err := io.Copy(io.Discard, b)
			if err == nil {
				return // clean end frame
			}
			if !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrRemote) {
				t.Fatalf("body error %v wraps neither ErrTruncated nor ErrRemote", err)
			}
			if n > int64(len(wire)) {
				t.Fatalf("body yielded %d bytes from %d on the wire", n, len(wire))
			}
		}
	})
}
