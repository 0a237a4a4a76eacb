package transport

import (
	"errors"
	"reflect"
	"testing"
	"time"
)

// TestDelegateField pins the delegation field: it round-trips with and without the explain
// flag, PreviousVersion drops it (it is optional: that version's reader runs the request
// itself), and flags this build does not know or a delegation outside a request are
// malformed.
func TestDelegateField(t *testing.T) {
	for _, d := range []*Delegation{{}, {Explain: true}} {
		h := Header{Version: Version, RequestID: "r", Hops: 1, Ingress: "a", TTFTSLO: time.Second,
			QueueTTL: time.Minute, QueueTTLLeft: time.Second, Delegate: d}
		p, err := EncodeHeader(nil, h)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := DecodeHeader(p); err != nil || !reflect.DeepEqual(got, h) {
			t.Errorf("round trip %+v, %v; want %+v", got, err, h)
		}
		h.Version = PreviousVersion
		p, err = EncodeHeader(nil, h)
		if err != nil {
			t.Fatal(err)
		}
		want := h
		want.Delegate = nil
		if got, err := DecodeHeader(p); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("version %d: %+v, %v; want %+v without the delegation", PreviousVersion, got, err, want)
		}
	}
	p, err := EncodeHeader(nil, Header{RequestID: "r", Delegate: &Delegation{Explain: true}})
	if err != nil {
		t.Fatal(err)
	}
	p[len(p)-1] = 3 // the flags byte, last: a flag this build does not know
	if _, err := DecodeHeader(p); !errors.Is(err, ErrMalformed) {
		t.Errorf("unknown delegate flag: %v, want %v", err, ErrMalformed)
	}
	if _, err := EncodeHeader(nil, Header{Kind: KindAgentRenew, Delegate: &Delegation{}}); !errors.Is(err, ErrMalformed) {
		t.Errorf("a delegation in a renew header: %v, want %v", err, ErrMalformed)
	}
}
