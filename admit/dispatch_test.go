package admit

import (
	"testing"
	"time"
)

// TestReadyHysteresis pins down that a queued request needs KV use under the lower mark
// (queue_off) while a fresh one is accepted up to queue_on, that a queued request whose
// deadline passed is refused rather than served late, and that a head dispatches on the room
// it claimed at queue_on.
func TestReadyHysteresis(t *testing.T) {
	a := newAdmitter(t, nil)
	r := baseReq() // 13 blocks
	o := idle()
	o.FreeKVBlocks = 100 // used after: 913/1000 — under 0.95, over 0.85
	if d := a.Admit(t0, r, []Option{o}); d.Action != Accept {
		t.Fatalf("fresh request refused at 0.913: %+v", d)
	}
	d := a.Admit(t0, r, []Option{{FreeKVBlocks: 0, TotalKVBlocks: 1000, PredictedTTFT: time.Millisecond}})
	if d.Action != Queue {
		t.Fatalf("want queue, got %+v", d)
	}
	it := a.Item(r, d)
	if got := a.Ready(t0, it, []Option{o}); got.Action != Queue {
		t.Fatalf("queued request dispatched above queue_off: %+v", got)
	}
	o.FreeKVBlocks = 200 // used after 813/1000
	if got := a.Ready(t0, it, []Option{o}); got.Action != Accept || got.Option != 0 || got.KVBlocks != 13 {
		t.Fatalf("queued request not dispatched under queue_off: %+v", got)
	}
	if got := a.Ready(t0.Add(2*time.Second), it, []Option{o}); got.Code != CodeSLOUnattainable || got.Status != 429 {
		t.Fatalf("late queued request not refused: %+v", got)
	}

	// A head starts on the room it claimed at the admission mark: the claim, not the
	// hysteresis, kept the rest of the mesh off it.
	o.Peer, o.FreeKVBlocks = "x", 100 // used after 913/1000
	for _, tt := range []struct {
		claim Claim
		want  Action
	}{
		{Claim{Peer: "y", Blocks: 13, Publish: true}, Queue},  // another node's room
		{Claim{Peer: "x", Blocks: 13}, Queue},                 // held against this node's backfill only
		{Claim{Peer: "x", Blocks: 13, Publish: true}, Accept}, // the mesh keeps off it
	} {
		it.Claim = tt.claim
		if got := a.Ready(t0, it, []Option{o}); got.Action != tt.want {
			t.Errorf("claim %+v at 913/1000: %+v, want %v", tt.claim, got, tt.want)
		}
	}
}

// TestReadyKeepsSlack pins that a queued request is dispatched only with a fifth of its TTFT
// target to spare, and refused once it has not.
func TestReadyKeepsSlack(t *testing.T) {
	a := newAdmitter(t, nil)
	r := baseReq()
	it := a.Item(r, a.Admit(t0, r, []Option{{FreeKVBlocks: 0, TotalKVBlocks: 1000, PredictedTTFT: time.Millisecond}}))
	o := idle() // 100 ms predicted; the normal class's target is 2 s, dispatched within 1.6 s
	if got := a.Ready(t0.Add(1400*time.Millisecond), it, []Option{o}); got.Action != Accept {
		t.Fatalf("waited 1.4 s + 0.1 s predicted, of 1.6: %+v, want accept", got)
	}
	if got := a.Ready(t0.Add(1600*time.Millisecond), it, []Option{o}); got.Code != CodeSLOUnattainable {
		t.Fatalf("waited 1.6 s + 0.1 s predicted, of 1.6: %+v, want slo_unattainable", got)
	}
}

// TestClaimFor pins the room a blocked head claims: its blocks on the option with the most free
// KV among those that can still meet its SLO (among all when none can), and what Take leaves
// of that option for the work behind it.
func TestClaimFor(t *testing.T) {
	opt := func(peer string, free int, ttft time.Duration) Option {
		o := idle()
		o.Peer, o.FreeKVBlocks, o.PredictedTTFT = peer, free, ttft
		return o
	}
	slow := 5 * time.Second // past the normal class's 2 s TTFT
	tests := []struct {
		name string
		opts []Option
		want Claim
	}{
		{"most free", []Option{opt("a", 10, 0), opt("b", 30, 0), opt("c", 20, 0)}, Claim{Peer: "b", Blocks: 13}},
		{"most free that meets the SLO", []Option{opt("a", 10, 0), opt("b", 30, slow), opt("c", 20, 0)}, Claim{Peer: "c", Blocks: 13}},
		{"most free when none meets it", []Option{opt("a", 10, slow), opt("b", 30, slow)}, Claim{Peer: "b", Blocks: 13}},
		{"no options", nil, Claim{}},
	}
	a := newAdmitter(t, nil)
	r := baseReq() // 13 blocks
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := a.ClaimFor(t0, a.Item(r, a.Admit(t0, r, nil)), tt.opts); got != tt.want {
				t.Fatalf("ClaimFor = %+v, want %+v", got, tt.want)
			}
		})
	}
	// Published for the mesh only past the hysteresis gap (0.95 − 0.85 of the pool), for a
	// whole candidate and a head that is not sheddable.
	small := func(o Option) Option { o.TotalKVBlocks = 100; return o } // a gap of 10 blocks
	for _, tt := range []struct {
		name string
		o    Option
		prio int
		want bool
	}{
		{"within the gap", opt("a", 30, 0), 0, false},
		{"past the gap", small(opt("a", 30, 0)), 0, true},
		{"past the gap, high", small(opt("a", 30, 0)), 5, true},
		{"sheddable", small(opt("a", 30, 0)), -1, false},
		{"a pair", func() Option { o := small(opt("a", 30, 0)); o.Split = true; return o }(), 0, false},
		{"an explicit target", small(opt("a", 30, 0)), 0, false},
	} {
		r := baseReq()
		r.Priority = tt.prio
		if tt.name == "an explicit target" {
			r.TTFTSLO = 5 * time.Second
		}
		if got := a.ClaimFor(t0, a.Item(r, a.Admit(t0, r, nil)), []Option{tt.o}); got.Publish != tt.want || got.Blocks != 13 {
			t.Errorf("%s: ClaimFor = %+v, want Publish %v", tt.name, got, tt.want)
		}
	}

	opts := []Option{opt("a", 10, 0), opt("b", 30, 0)}
	Claim{Peer: "b", Blocks: 13}.Take(opts)
	if opts[0].FreeKVBlocks != 10 || opts[1].FreeKVBlocks != 17 {
		t.Fatalf("after Take: free %d and %d, want 10 and 17", opts[0].FreeKVBlocks, opts[1].FreeKVBlocks)
	}
	Claim{Peer: "b", Blocks: 20}.Take(opts)
	if fits(opts[1], 1, 1) {
		t.Fatal("a request fits on the room a head holds")
	}
}

// TestItemCountsPrefillWork pins down that a queued request enters the room priced in the
// prefill work it brings (the prompt less the longest cached prefix), not its whole prompt.
func TestItemCountsPrefillWork(t *testing.T) {
	a := newAdmitter(t, nil)
	r := baseReq()
	r.PromptTokens = 4000
	o := idle()
	o.FreeKVBlocks, o.CachedTokens = 0, 3800
	d := a.Admit(t0, r, []Option{o})
	if d.Action != Queue || d.PrefillTokens != 200 {
		t.Fatalf("want queue with 200 prefill tokens, got %+v", d)
	}
	if it := a.Item(r, d); it.Tokens != 200 {
		t.Errorf("item tokens %d, want 200", it.Tokens)
	}
}

// TestFallbackIsNotChosen: an option routing keeps only as dispatch's fallback is neither
// chosen nor counted feasible, at the ingress, in the room or for a head's claim: with the
// first option full, the request waits (and its claim names the first) even though the
// fallback has room; without the mark it runs on the fallback.
func TestFallbackIsNotChosen(t *testing.T) {
	a := newAdmitter(t, nil)
	r := baseReq()
	full := idle()
	full.Peer, full.FreeKVBlocks = "home", 0
	other := idle()
	other.Peer, other.Fallback = "other", true
	if d := a.Admit(t0, r, []Option{full, other}); d.Action != Queue {
		t.Fatalf("Admit: want queue for the home's room, got %+v", d)
	}
	it := a.Item(r, Decision{Action: Queue})
	if d := a.Ready(t0, it, []Option{full, other}); d.Action != Queue {
		t.Fatalf("Ready: want queue for the home's room, got %+v", d)
	}
	if c := a.ClaimFor(t0, it, []Option{full, other}); c.Peer != "home" {
		t.Fatalf("ClaimFor: want the home's room, got %+v", c)
	}
	other.Fallback = false
	if d := a.Admit(t0, r, []Option{full, other}); d.Action != Accept || d.Option != 1 {
		t.Fatalf("Admit without the mark: want accept on the other, got %+v", d)
	}
	if d := a.Ready(t0, it, []Option{full, other}); d.Action != Accept || d.Option != 1 {
		t.Fatalf("Ready without the mark: want accept on the other, got %+v", d)
	}
}
