package transport

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

func TestHeaderRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		h    Header
	}{
		{"zero", Header{}},
		{"common limits", Header{RequestID: "r", Hops: maxHops, Priority: -1 << 31, Deadline: time.Unix(0, 1)}},
		{"request", Header{Kind: KindRequest, Tenant: "t", AgentID: "ü", Blocks: make([]uint64, MaxBlocks), Ingress: "a",
			Endpoint: EndpointCompletions, Waited: 1500 * time.Microsecond, TTFTSLO: 2 * time.Second,
			TPOTSLO: 200 * time.Millisecond, AgentFinal: true}},
		{"request at the duration limit", Header{Endpoint: EndpointChat, Waited: math.MaxInt64, TTFTSLO: 1, TPOTSLO: math.MaxInt64}},
		{"embeddings request", Header{Endpoint: EndpointEmbeddings, RequestID: "r", Hops: 1, Tenant: "t", Ingress: "a"}},
		{"responses request", Header{Endpoint: EndpointResponses, RequestID: "r", Hops: 1, Priority: 10, Ingress: "a"}},
		{"messages request", Header{Endpoint: EndpointMessages, RequestID: "m", Hops: 1, Priority: 1, Ingress: "a",
			Blocks: []uint64{7, 8}, TTFTSLO: time.Second}},
		{"agent renew", Header{Kind: KindAgentRenew, RequestID: "r", Hops: 1, Priority: 3, Tenant: "t", AgentID: "a",
			Ingress: "b", RenewWait: 250 * time.Millisecond}},
		{"agent renew without a wait", Header{Kind: KindAgentRenew, AgentID: "a"}},
		{"agent give-up", Header{Kind: KindAgentGiveUp, RequestID: "r", Hops: 1, AgentID: "a", Ingress: "b"}},
		{"request with a trace parent", Header{RequestID: "r", Hops: 1, Ingress: "a", AgentFinal: true,
			TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}},
		{"request with a trace state", Header{Endpoint: EndpointCompletions, TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
			TraceState: "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"}},
		{"continuation", Header{RequestID: "r", Hops: 1, Ingress: "a", Resume: &Resume{Seed: math.MaxUint64, PromptHash: 7,
			Tokens: 12, Bytes: 48, PromptTokens: maxResumeCount}}},
		{"traced continuation", Header{Endpoint: EndpointCompletions, TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			Resume: &Resume{}}},
		{"prefill half", Header{RequestID: "r", Hops: 1, Ingress: "a", Blocks: []uint64{1, 2}, Prefill: true}},
		{"decode half", Header{RequestID: "r", Hops: 1, Ingress: "a", Handover: &Handover{PromptTokens: 4000, CachedTokens: 1024,
			KVBytes: 4000 << 17, ReadyAt: 258 * time.Millisecond, Params: []byte(`{"remote_engine_id":"e"}`)}}},
		{"decode half at the limits", Header{Handover: &Handover{PromptTokens: maxResumeCount, CachedTokens: maxResumeCount,
			KVBytes: math.MaxInt64, ReadyAt: math.MaxInt64, Params: make([]byte, MaxHandoverParams)}}},
		{"traced decode of a continuation", Header{TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			Resume: &Resume{Tokens: 3}, Handover: &Handover{PromptTokens: 9}}},
		{"traced prefill of a continuation", Header{TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			Resume: &Resume{Tokens: 3}, Prefill: true}},
		{"request with a queue ttl", Header{RequestID: "r", Hops: 1, Ingress: "a", Waited: time.Second,
			QueueTTL: time.Minute, QueueTTLLeft: 59 * time.Second}},
		{"traced decode half with a queue ttl", Header{TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			Handover: &Handover{PromptTokens: 9}, QueueTTL: 300 * time.Millisecond, QueueTTLLeft: 1}},
		{"prefill half with all its queue ttl left", Header{Prefill: true, QueueTTL: math.MaxInt64, QueueTTLLeft: math.MaxInt64}},
	}
	for _, v := range []int{Version, PreviousVersion} {
		for _, tt := range tests {
			t.Run(fmt.Sprintf("v%d %s", v, tt.name), func(t *testing.T) {
				tt.h.Version = v
				p, err := EncodeHeader(nil, tt.h)
				if err != nil {
					t.Fatalf("encode: %v", err)
				}
				if int(p[0]) != v || Kind(p[1]) != tt.h.Kind {
					t.Errorf("encoding starts %v, want version %d and kind %d", p[:2], v, tt.h.Kind)
				}
				got, err := DecodeHeader(p)
				if err != nil {
					t.Fatalf("decode: %v", err)
				}
				if !reflect.DeepEqual(got, tt.h) {
					t.Errorf("round trip %+v, want %+v", got, tt.h)
				}
			})
		}
	}
}

// TestHandoverBody pins the prefill owner's answer: AppendHandover's bytes decode to the same
// record, and anything else is malformed.
func TestHandoverBody(t *testing.T) {
	h := &Handover{PromptTokens: 8000, CachedTokens: 2048, KVBytes: 8000 << 17, ReadyAt: 305 * time.Millisecond, Params: []byte("p")}
	p, err := AppendHandover(nil, h)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeHandover(p)
	if err != nil || !reflect.DeepEqual(got, h) {
		t.Fatalf("DecodeHandover = %+v, %v; want %+v", got, err, h)
	}
	for _, bad := range [][]byte{nil, p[:len(p)-1], append(p, 0), []byte(`{"prompt_tokens":1}`)} {
		if _, err := DecodeHandover(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("DecodeHandover(%q) = %v, want ErrMalformed", bad, err)
		}
	}
	if _, err := AppendHandover(nil, &Handover{CachedTokens: -1}); !errors.Is(err, ErrMalformed) {
		t.Errorf("AppendHandover of negative tokens = %v, want ErrMalformed", err)
	}
}

// TestHeaderLayout pins the bytes of a request header in both versions: PreviousVersion's are
// those a peer of that version reads, flags and all; Version's carry the same field tagged.
func TestHeaderLayout(t *testing.T) {
	h := Header{RequestID: "r", Hops: 1, Endpoint: EndpointCompletions, AgentFinal: true, Waited: 1, TTFTSLO: 2, TPOTSLO: 3}
	for _, tt := range []struct {
		v    int
		want []byte
	}{
		{PreviousVersion, []byte{PreviousVersion, byte(KindRequest), 1, 'r', 1, 0, 0, 0, 0, 0, 0, byte(EndpointCompletions), 1, 1, 2, 3}},
		{Version, []byte{Version, byte(KindRequest), 1, 'r', 1, 0, 0, 0, 0, 0, 0, byte(EndpointCompletions), 1, 2, 3, 1, 0}},
	} {
		h.Version = tt.v
		p, err := EncodeHeader(nil, h)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(p, tt.want) {
			t.Errorf("version %d: encoding %v, want %v", tt.v, p, tt.want)
		}
	}
}

// zeroCommon is the encoding of a header's common fields, all zero: request id, hops,
// priority, tenant, deadline, agent id, blocks and ingress.
var zeroCommon = []byte{0, 0, 0, 0, 0, 0, 0, 0}

// rawHeader is a header encoding: version, kind, zero common fields, then tail.
func rawHeader(version byte, kind Kind, tail ...byte) []byte {
	return append(append([]byte{version, byte(kind)}, zeroCommon...), tail...)
}

// TestEndpointNames pins the endpoint names logs show, one per endpoint this version knows.
func TestEndpointNames(t *testing.T) {
	want := []string{"chat", "completions", "embeddings", "responses", "messages"}
	if int(numEndpoints) != len(want) {
		t.Fatalf("%d endpoints, %d names", numEndpoints, len(want))
	}
	for i, w := range want {
		if got := Endpoint(i).String(); got != w {
			t.Errorf("Endpoint(%d) = %q, want %q", i, got, w)
		}
	}
	if got := numEndpoints.String(); got != fmt.Sprintf("endpoint(%d)", numEndpoints) {
		t.Errorf("unknown endpoint = %q", got)
	}
}

func TestHeaderRejects(t *testing.T) {
	valid, _ := EncodeHeader(nil, Header{RequestID: "r"})
	encodeTests := []struct {
		name string
		h    Header
		want error
	}{
		{"old version", Header{Version: 1}, ErrVersion},
		{"newer version", Header{Version: Version + 1}, ErrVersion},
		{"unknown kind", Header{Kind: numKinds}, ErrKind},
		{"unknown endpoint", Header{Endpoint: numEndpoints}, ErrKind},
		{"hops", Header{Hops: maxHops + 1}, ErrMalformed},
		{"negative hops", Header{Hops: -1}, ErrMalformed},
		{"priority", Header{Priority: 1 << 40}, ErrMalformed},
		{"blocks", Header{Blocks: make([]uint64, MaxBlocks+1)}, ErrMalformed},
		{"negative waited", Header{Waited: -1}, ErrMalformed},
		{"negative slo", Header{TPOTSLO: -time.Second}, ErrMalformed},
		{"negative renew wait", Header{Kind: KindAgentRenew, RenewWait: -1}, ErrMalformed},
		{"endpoint in a renew", Header{Kind: KindAgentRenew, Endpoint: EndpointCompletions}, ErrMalformed},
		{"slo in a give-up", Header{Kind: KindAgentGiveUp, TTFTSLO: time.Second}, ErrMalformed},
		{"agent final in a renew", Header{Kind: KindAgentRenew, AgentFinal: true}, ErrMalformed},
		{"renew wait in a request", Header{RenewWait: time.Second}, ErrMalformed},
		{"renew wait in a give-up", Header{Kind: KindAgentGiveUp, RenewWait: time.Second}, ErrMalformed},
		{"long string", Header{Tenant: strings.Repeat("t", maxShortString+1)}, ErrMalformed},
		{"bad utf-8", Header{RequestID: "\xff"}, ErrMalformed},
		{"trace state alone", Header{TraceState: "a=b"}, ErrMalformed},
		{"trace in a renew", Header{Kind: KindAgentRenew, TraceParent: "00-x"}, ErrMalformed},
		{"long trace parent", Header{TraceParent: strings.Repeat("t", maxShortString+1)}, ErrMalformed},
		{"resume in a renew", Header{Kind: KindAgentRenew, Resume: &Resume{}}, ErrMalformed},
		{"negative resume tokens", Header{Resume: &Resume{Tokens: -1}}, ErrMalformed},
		{"resume bytes past int32", Header{Resume: &Resume{Bytes: maxResumeCount + 1}}, ErrMalformed},
		{"prefill with a handover", Header{Prefill: true, Handover: &Handover{}}, ErrMalformed},
		{"prefill in a renew", Header{Kind: KindAgentRenew, Prefill: true}, ErrMalformed},
		{"handover in a give-up", Header{Kind: KindAgentGiveUp, Handover: &Handover{}}, ErrMalformed},
		{"negative handover bytes", Header{Handover: &Handover{KVBytes: -1}}, ErrMalformed},
		{"handover tokens past int32", Header{Handover: &Handover{PromptTokens: maxResumeCount + 1}}, ErrMalformed},
		{"handover params too long", Header{Handover: &Handover{Params: make([]byte, MaxHandoverParams+1)}}, ErrMalformed},
		{"queue ttl without what is left", Header{QueueTTL: time.Second}, ErrMalformed},
		{"queue ttl left without a ttl", Header{QueueTTLLeft: time.Second}, ErrMalformed},
		{"more queue ttl left than the ttl", Header{QueueTTL: time.Second, QueueTTLLeft: time.Second + 1}, ErrMalformed},
		{"negative queue ttl", Header{QueueTTL: -time.Second, QueueTTLLeft: -time.Second}, ErrMalformed},
		{"queue ttl in a renew", Header{Kind: KindAgentRenew, QueueTTL: time.Second, QueueTTLLeft: time.Second}, ErrMalformed},
	}
	for _, tt := range encodeTests {
		t.Run("encode "+tt.name, func(t *testing.T) {
			if _, err := EncodeHeader(nil, tt.h); !errors.Is(err, tt.want) {
				t.Errorf("EncodeHeader = %v, want %v", err, tt.want)
			}
		})
	}
	// Version 1's encoding of {RequestID: "r", Path: "/v1/chat/completions"}: an API path
	// and an empty meta map where version 2 has a kind and typed fields.
	v1 := append([]byte{1, 1, 'r', 0, 0, 0, 0, 0, 0, 0, 20}, "/v1/chat/completions\x00"...)
	decodeTests := []struct {
		name string
		p    []byte
		want error
	}{
		{"empty", nil, ErrMalformed},
		{"version 1", v1, ErrVersion},
		{"newer version", append([]byte{Version + 1}, valid[1:]...), ErrVersion},
		{"version 0", []byte{0}, ErrVersion},
		{"no kind", []byte{Version}, ErrMalformed},
		{"unknown kind", []byte{Version, byte(numKinds)}, ErrKind},
		{"unknown kind with garbage", []byte{Version, 0xff, 0xff, 0xff}, ErrKind},
		{"unknown endpoint", rawHeader(Version, KindRequest, byte(numEndpoints), 0, 0, 0, 0), ErrKind},
		{"unknown request flag", rawHeader(PreviousVersion, KindRequest, 0, 64, 0, 0, 0), ErrMalformed},
		{"queue ttl flag without a ttl", rawHeader(PreviousVersion, KindRequest, 0, 32, 0, 0, 0), ErrMalformed},
		{"queue ttl with nothing left", rawHeader(PreviousVersion, KindRequest, 0, 32, 0, 0, 0, 5, 0), ErrMalformed},
		{"queue ttl with more left than it", rawHeader(PreviousVersion, KindRequest, 0, 32, 0, 0, 0, 5, 6), ErrMalformed},
		{"handover flag without a handover", rawHeader(PreviousVersion, KindRequest, 0, 16, 0, 0, 0), ErrMalformed},
		{"prefill and handover flags", rawHeader(PreviousVersion, KindRequest, 0, 8|16, 0, 0, 0, 1, 0, 0, 0, 0), ErrMalformed},
		{"handover cut in its params", rawHeader(PreviousVersion, KindRequest, 0, 16, 0, 0, 0, 1, 0, 0, 0, 5, 'x'), ErrMalformed},
		{"resume flag without a resume", rawHeader(PreviousVersion, KindRequest, 0, 4, 0, 0, 0), ErrMalformed},
		{"resume cut in its counts", rawHeader(PreviousVersion, KindRequest, append([]byte{0, 4, 0, 0, 0}, make([]byte, 18)...)...), ErrMalformed},
		{"resume prompt tokens past int32", rawHeader(PreviousVersion, KindRequest, append(append([]byte{0, 4, 0, 0, 0}, make([]byte, 18)...),
			0x80, 0x80, 0x80, 0x80, 0x08)...), ErrMalformed},
		{"trace flag without a trace", rawHeader(PreviousVersion, KindRequest, 0, 2, 0, 0, 0), ErrMalformed},
		{"trace flag with an empty trace", rawHeader(PreviousVersion, KindRequest, 0, 2, 0, 0, 0, 0, 0), ErrMalformed},
		{"trace state cut short", rawHeader(PreviousVersion, KindRequest, 0, 2, 0, 0, 0, 1, 'p', 3, 's'), ErrMalformed},
		{"fields out of tag order", rawHeader(Version, KindRequest, 0, 0, 0, 0, 5, 0, 1, 0), ErrMalformed},
		{"a field twice", rawHeader(Version, KindRequest, 0, 0, 0, 0, 1, 0, 1, 0), ErrMalformed},
		{"tag 0", rawHeader(Version, KindRequest, 0, 0, 0, 0, 0, 0), ErrMalformed},
		{"a field's value cut short", rawHeader(Version, KindRequest, 0, 0, 0, 0, 8, 3, 5, 5), ErrMalformed},
		{"a field's value with a byte over", rawHeader(Version, KindRequest, 0, 0, 0, 0, 1, 1, 0), ErrMalformed},
		{"an empty trace field", rawHeader(Version, KindRequest, 0, 0, 0, 0, 2, 2, 0, 0), ErrMalformed},
		{"a request field in a renew", rawHeader(Version, KindAgentRenew, 0, 1, 0), ErrMalformed},
		{"a required field this build does not know", rawHeader(Version, KindRequest, 0, 0, 0, 0, 101, 1, 'x'), ErrKind},
		{"a required field it does not know in a give-up", rawHeader(Version, KindAgentGiveUp, 9, 0), ErrKind},
		{"request without its fields", rawHeader(Version, KindRequest), ErrMalformed},
		{"request cut in its slos", rawHeader(PreviousVersion, KindRequest, 0, 0, 0, 0), ErrMalformed},
		{"waited past int64", rawHeader(PreviousVersion, KindRequest, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0, 0), ErrMalformed},
		{"renew without its wait", rawHeader(Version, KindAgentRenew), ErrMalformed},
		{"give-up with a wait", rawHeader(Version, KindAgentGiveUp, 5), ErrMalformed},
		{"renew with request fields", rawHeader(Version, KindAgentRenew, 0, 0, 0, 0, 0), ErrMalformed},
		{"overlong varint", rawHeader(Version, KindAgentRenew, 0x80, 0x00), ErrMalformed},
		{"overlong string length", []byte{Version, 0, 0x81, 0x00, 'r', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, ErrMalformed},
		{"trailing", append(append([]byte(nil), valid...), 0), ErrMalformed},
		{"truncated", valid[:len(valid)-1], ErrMalformed},
		{"huge string length", []byte{Version, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}, ErrMalformed},
		{"blocks past the end", []byte{Version, 0, 0, 0, 0, 0, 0, 0, 5, 1, 2}, ErrMalformed},
		{"too many blocks", []byte{Version, 0, 0, 0, 0, 0, 0, 0, 0x81, 0x80, 0x04}, ErrMalformed},
		{"too big", make([]byte, MaxHeaderBytes+1), ErrMalformed},
	}
	for _, tt := range decodeTests {
		t.Run("decode "+tt.name, func(t *testing.T) {
			if _, err := DecodeHeader(tt.p); !errors.Is(err, tt.want) {
				t.Errorf("DecodeHeader = %v, want %v", err, tt.want)
			}
		})
	}
	// The zero tails above are well-formed with the right kind: the rejections are theirs.
	for _, p := range [][]byte{rawHeader(PreviousVersion, KindRequest, 0, 1, 0, 0, 0), rawHeader(PreviousVersion, KindRequest, 0, 3, 0, 0, 0, 1, 'p', 0),
		rawHeader(PreviousVersion, KindRequest, append([]byte{0, 4, 0, 0, 0}, make([]byte, 19)...)...),
		rawHeader(PreviousVersion, KindRequest, 0, 32, 0, 0, 0, 5, 5),
		rawHeader(Version, KindRequest, 0, 0, 0, 0, 1, 0, 8, 2, 5, 5),
		rawHeader(Version, KindRequest, 0, 0, 0, 0, 100, 1, 'x'), // an optional field this build does not know
		rawHeader(PreviousVersion, KindAgentRenew, 0), rawHeader(PreviousVersion, KindAgentGiveUp),
		rawHeader(Version, KindAgentRenew, 0), rawHeader(Version, KindAgentGiveUp)} {
		if _, err := DecodeHeader(p); err != nil {
			t.Errorf("DecodeHeader(%v) = %v", p, err)
		}
	}
}

// TestVersionRefusalLayout pins the bytes of the owner's version refusal: a node on another
// frame version must read them with its own refuse decoder, so they may never change.
func TestVersionRefusalLayout(t *testing.T) {
	p, err := encodeRefuse(Refusal{Status: StatusVersion, Code: CodeVersion, Message: "m"})
	if err != nil {
		t.Fatal(err)
	}
	want := append(append([]byte{0xf9, 0x03, 13}, "frame_version"...), 1, 'm', 0, 0)
	if !bytes.Equal(p, want) {
		t.Errorf("version refusal encodes as %v, want %v", p, want)
	}
}

func TestRefusalIs(t *testing.T) {
	tests := []struct {
		r       Refusal
		version bool
		kind    bool
	}{
		{Refusal{Status: StatusVersion, Code: CodeVersion}, true, false},
		{Refusal{Status: StatusKind, Code: CodeKind}, false, true},
		{Refusal{Status: 429, Code: CodeVersion}, false, false},
		{Refusal{Status: StatusKind, Code: "no_capacity"}, false, false},
	}
	for _, tt := range tests {
		err := fmt.Errorf("forward: %w", &tt.r)
		if errors.Is(err, ErrVersion) != tt.version || errors.Is(err, ErrKind) != tt.kind {
			t.Errorf("%d %s: Is(ErrVersion) %v, Is(ErrKind) %v; want %v, %v", tt.r.Status, tt.r.Code,
				errors.Is(err, ErrVersion), errors.Is(err, ErrKind), tt.version, tt.kind)
		}
		if ref := (*Refusal)(nil); !errors.As(err, &ref) {
			t.Errorf("%v is not a *Refusal", err)
		}
	}
}

func bigHeaders(n int) map[string]string {
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
		{"accept headers", func() error { _, err := encodeAccept(200, bigHeaders(MaxAcceptHeaders+1)); return err }()},
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

// FuzzDecodeHeader feeds arbitrary bytes to the header decoder, the first thing an owner reads
// from a peer.
func FuzzDecodeHeader(f *testing.F) {
	for _, h := range []Header{
		{},
		{RequestID: "r", Blocks: []uint64{1, 2}, Deadline: time.Unix(5, 0), Endpoint: EndpointCompletions,
			Waited: time.Millisecond, TTFTSLO: time.Second, TPOTSLO: 50 * time.Millisecond, AgentFinal: true},
		{Kind: KindAgentRenew, AgentID: "a", Ingress: "b", RenewWait: time.Second},
		{Kind: KindAgentGiveUp, AgentID: "a", Priority: -5},
		{RequestID: "e", Endpoint: EndpointEmbeddings, Tenant: "t", Ingress: "a"},
		{RequestID: "p", Endpoint: EndpointResponses, Hops: 1, Ingress: "a"},
		{RequestID: "t", Hops: 1, Ingress: "a", TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", TraceState: "k=v"},
		{RequestID: "c", Hops: 1, Ingress: "a", Resume: &Resume{Seed: 1, PromptHash: 2, Tokens: 3, Bytes: 12, PromptTokens: 40}},
		{RequestID: "q", Hops: 1, Ingress: "a", Prefill: true, QueueTTL: time.Minute, QueueTTLLeft: time.Second},
	} {
		p, _ := EncodeHeader(nil, h)
		f.Add(p)
		h.Version = PreviousVersion
		p, _ = EncodeHeader(nil, h)
		f.Add(p)
	}
	f.Add(rawHeader(Version, KindRequest, 0, 0, 0, 0, 1, 0, 100, 1, 'x')) // an optional field this build does not know
	f.Add(rawHeader(Version, KindRequest, 0, 0, 0, 0, 101, 0))            // a required one
	f.Add([]byte{1, 1, 'r', 0, 0, 0, 0, 0, 0, 0, 0, 0})                   // version 1
	f.Add([]byte{Version, byte(numKinds)})
	f.Add(rawHeader(Version, KindRequest, byte(numEndpoints), 0, 0, 0, 0))
	f.Add([]byte{Version, 0, 0xff})
	f.Fuzz(func(t *testing.T, p []byte) {
		h, err := DecodeHeader(p)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrVersion) && !errors.Is(err, ErrKind) {
				t.Fatalf("decode error %v wraps none of ErrMalformed, ErrVersion, ErrKind", err)
			}
			if errors.Is(err, ErrVersion) != (len(p) > 0 && len(p) <= MaxHeaderBytes && p[0] != Version && p[0] != PreviousVersion) {
				t.Fatalf("ErrVersion is %v for version byte %v", errors.Is(err, ErrVersion), p[:min(len(p), 1)])
			}
			return
		}
		if h.Version != int(p[0]) || h.Kind >= numKinds || h.Endpoint >= numEndpoints || len(h.Blocks) > MaxBlocks {
			t.Fatalf("decoded an invalid header %+v", h)
		}
		// Whatever decodes must re-encode in its version to the same bytes (the encoding is
		// canonical), bar the optional fields this build does not know, which it skipped, and
		// decode to the same header.
		q, err := EncodeHeader(nil, h)
		if err != nil {
			t.Fatalf("re-encode of a decoded header: %v", err)
		}
		if !bytes.Equal(p, q) && (h.Version == PreviousVersion || len(q) >= len(p)) {
			t.Fatalf("re-encoding %v gave %v", p, q)
		}
		h2, err := DecodeHeader(q)
		if err != nil || !reflect.DeepEqual(h, h2) {
			t.Fatalf("round trip changed the header: %+v vs %+v (%v)", h, h2, err)
		}
	})
}

// FuzzEncodeHeader builds headers of every kind, known and not, from typed fields: what the
// encoder accepts must decode to the same header, and what it refuses it refuses with a
// sentinel.
func FuzzEncodeHeader(f *testing.F) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	f.Add(uint8(KindRequest), uint8(EndpointChat), "r", "a", 1, int64(-3), int64(5e9), uint16(2), int64(1e6), int64(2e9), int64(1e8), true, int64(0), "", "", 0)
	f.Add(uint8(KindAgentRenew), uint8(0), "r", "a", 1, int64(0), int64(0), uint16(0), int64(0), int64(0), int64(0), false, int64(5e8), "", "", 0)
	f.Add(uint8(KindAgentGiveUp), uint8(0), "", "a", 0, int64(0), int64(0), uint16(0), int64(0), int64(0), int64(0), false, int64(0), "", "", 0)
	f.Add(uint8(KindRequest), uint8(EndpointEmbeddings), "e", "", 0, int64(0), int64(0), uint16(0), int64(0), int64(0), int64(0), false, int64(0), "", "", 0)
	f.Add(uint8(KindRequest), uint8(EndpointResponses), "p", "", 1, int64(10), int64(0), uint16(0), int64(0), int64(0), int64(0), false, int64(0), "", "", 0)
	f.Add(uint8(KindRequest), uint8(EndpointChat), "t", "a", 1, int64(0), int64(0), uint16(1), int64(0), int64(0), int64(0), true, int64(0), tp, "k=v", 0)
	f.Add(uint8(KindRequest), uint8(EndpointChat), "t", "", 1, int64(0), int64(0), uint16(0), int64(0), int64(0), int64(0), false, int64(0), "", "k=v", 0)
	f.Add(uint8(KindAgentRenew), uint8(0), "t", "", 1, int64(0), int64(0), uint16(0), int64(0), int64(0), int64(0), false, int64(0), tp, "", 0)
	f.Add(uint8(numKinds), uint8(numEndpoints), "\xff", "", -1, int64(1<<40), int64(-1), uint16(0), int64(-1), int64(0), int64(0), true, int64(1), "\xff", "", 0)
	f.Add(uint8(KindRequest), uint8(EndpointChat), "c", "a", 1, int64(0), int64(0), uint16(1), int64(0), int64(0), int64(0), false, int64(0), "", "", 12)
	f.Add(uint8(KindRequest), uint8(EndpointChat), "c", "a", 1, int64(0), int64(0), uint16(1), int64(0), int64(0), int64(0), false, int64(0), "", "", -1)
	f.Add(uint8(KindAgentGiveUp), uint8(0), "c", "a", 1, int64(0), int64(0), uint16(0), int64(0), int64(0), int64(0), false, int64(0), "", "", 1)
	f.Fuzz(func(t *testing.T, kind, endpoint uint8, id, agent string, hops int, prio, deadline int64, blocks uint16,
		waited, ttft, tpot int64, final bool, hold int64, traceParent, traceState string, resumed int) {
		h := Header{Kind: Kind(kind), RequestID: id, Hops: hops, Priority: int(prio), AgentID: agent, Ingress: agent,
			Endpoint: Endpoint(endpoint), Waited: time.Duration(waited), TTFTSLO: time.Duration(ttft),
			TPOTSLO: time.Duration(tpot), AgentFinal: final, RenewWait: time.Duration(hold),
			TraceParent: traceParent, TraceState: traceState}
		if resumed != 0 { // a continuation of resumed tokens (0: none)
			h.Resume = &Resume{Seed: uint64(resumed) * 0x9e3779b97f4a7c15, PromptHash: ^uint64(resumed), Tokens: resumed,
				Bytes: 4 * resumed, PromptTokens: resumed / 2}
		}
		if n := int(blocks) % 1024; n > 0 {
			h.Blocks = make([]uint64, n)
		}
		if blocks == math.MaxUint16 {
			h.Blocks = make([]uint64, MaxBlocks+1)
		}
		for i := range h.Blocks {
			h.Blocks[i] = uint64(i) * 0x9e3779b97f4a7c15
		}
		if deadline != 0 {
			h.Deadline = time.Unix(0, deadline)
		}
		p, err := EncodeHeader(nil, h)
		if err != nil {
			switch {
			case h.Kind >= numKinds && !errors.Is(err, ErrKind):
				t.Fatalf("unknown kind %d: %v, want ErrKind", kind, err)
			case !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrKind):
				t.Fatalf("encode error %v wraps neither ErrMalformed nor ErrKind", err)
			}
			return
		}
		if h.Kind >= numKinds {
			t.Fatalf("encoded a header of unknown kind %d", kind)
		}
		got, err := DecodeHeader(p)
		if err != nil {
			t.Fatalf("decode of an encoded header: %v", err)
		}
		h.Version = Version
		if !reflect.DeepEqual(got, h) {
			t.Fatalf("round trip %+v, want %+v", got, h)
		}
		// The previous version carries every field this one knows.
		h.Version = PreviousVersion
		if p, err = EncodeHeader(nil, h); err != nil {
			t.Fatalf("encode in version %d: %v", PreviousVersion, err)
		}
		if got, err = DecodeHeader(p); err != nil || !reflect.DeepEqual(got, h) {
			t.Fatalf("round trip in version %d: %+v, %v; want %+v", PreviousVersion, got, err, h)
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
			if s, h, err := decodeAccept(p); err == nil && (!validStatus(s) || len(h) > MaxAcceptHeaders) {
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

// TestNewFieldAndAnOlderReader adds fields to headerFields, as a later build would, and
// reads its headers with this build's: an optional field (even tag) is skipped and the rest of
// the header read as sent; a required one (odd tag) is refused as of an unknown kind, which
// the owner answers with StatusKind, so the ingress tries another peer. PreviousVersion cannot
// carry either: the optional one is dropped, the required one refused at the sender.
func TestNewFieldAndAnOlderReader(t *testing.T) {
	var sent, read string
	field := func(tag uint64) headerField {
		return headerField{tag: tag, name: "test note", has: func(*Header) bool { return sent != "" },
			put: func(e *encoder, _ *Header) { e.str(sent) },
			get: func(d *decoder, _ *Header) { read = d.str("test note", maxShortString) }}
	}
	h := Header{RequestID: "r", Hops: 1, Ingress: "a", AgentFinal: true, Prefill: true, QueueTTL: time.Minute, QueueTTLLeft: time.Second}
	want := h
	want.Version = Version
	for _, tt := range []struct {
		name    string
		tag     uint64
		oldErr  error
		prevErr error
	}{
		{"optional", 100, nil, nil},
		{"required", 101, ErrKind, ErrKind},
	} {
		t.Run(tt.name, func(t *testing.T) {
			newer := append(slices.Clone(headerFields), field(tt.tag))
			sent, read = "note", ""
			p, err := encodeHeader(nil, h, newer)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := decodeHeader(p, newer); err != nil || !reflect.DeepEqual(got, want) || read != sent {
				t.Fatalf("the newer build reads %+v, %q, %v; want %+v and %q", got, read, err, want, sent)
			}
			got, err := DecodeHeader(p)
			if !errors.Is(err, tt.oldErr) || err == nil && !reflect.DeepEqual(got, want) {
				t.Errorf("this build reads %+v, %v; want %+v, %v", got, err, want, tt.oldErr)
			}
			prev := h
			prev.Version = PreviousVersion
			q, err := encodeHeader(nil, prev, newer)
			if !errors.Is(err, tt.prevErr) {
				t.Fatalf("encoding in version %d: %v, want %v", PreviousVersion, err, tt.prevErr)
			}
			if err == nil {
				if got, err := DecodeHeader(q); err != nil || !reflect.DeepEqual(got, prev) {
					t.Errorf("version %d without the field: %+v, %v; want %+v", PreviousVersion, got, err, prev)
				}
			}
		})
	}
}

// TestHeaderFieldsTable pins the table's own rules: tags ascending and never 0, and the
// flag bits of PreviousVersion distinct.
func TestHeaderFieldsTable(t *testing.T) {
	var last uint64
	var flags byte
	for _, f := range headerFields {
		if f.tag <= last {
			t.Errorf("%s: tag %d after %d", f.name, f.tag, last)
		}
		if f.flag&flags != 0 {
			t.Errorf("%s: flag %#x used twice", f.name, f.flag)
		}
		last, flags = f.tag, flags|f.flag
	}
}
