package admit

import (
	"testing"
	"time"
)

func TestSLOStage(t *testing.T) {
	slow := func(ttft, tpot time.Duration) Option {
		o := idle()
		o.PredictedTTFT, o.PredictedTPOT = ttft, tpot
		return o
	}
	idleLong := slow(2500*time.Millisecond, time.Second)
	idleLong.PrefillTokensPerSecond = 3400
	tests := []struct {
		name    string
		waiting []*Item
		mod     func(*Request)
		opts    []Option
		code    string
		option  int
	}{
		{"meets", nil, func(*Request) {}, []Option{slow(time.Second, 50*time.Millisecond)}, CodeAccepted, 0},
		{"ttft over class default", nil, func(*Request) {}, []Option{slow(3*time.Second, 0)}, CodeSLOUnattainable, -1},
		{"header slo looser", nil, func(r *Request) { r.TTFTSLO = 5 * time.Second }, []Option{slow(3*time.Second, 0)}, CodeAccepted, 0},
		{"header slo tighter", nil, func(r *Request) { r.TTFTSLO = 50 * time.Millisecond }, []Option{slow(100*time.Millisecond, 0)}, CodeSLOUnattainable, -1},
		// Batch meets its own 30 s SLO on a 20 s queue, but runs only on spare capacity: a
		// candidate that would still serve normal traffic arriving behind it within half its 2 s.
		{"batch waits for spare capacity", nil, func(r *Request) { r.Priority = -1 }, []Option{slow(20*time.Second, time.Second)}, CodeWaitKV, -1},
		{"batch on spare capacity", nil, func(r *Request) { r.Priority = -1 }, []Option{slow(20*time.Second, time.Second), slow(time.Second, time.Second)}, CodeAccepted, 1},
		{"batch past half the normal ttft waits", nil, func(r *Request) { r.Priority = -1 }, []Option{slow(1500*time.Millisecond, time.Second)}, CodeWaitKV, -1},
		// A prompt longer than that starts on an engine with next to nothing ahead of it:
		// 8,000 tokens at 3,400/s are 2.35 s of the 2.5 s predicted, 0.15 s ahead of it.
		{"batch's own long prefill on an idle engine", nil, func(r *Request) { r.Priority, r.PromptTokens = -1, 8000 }, []Option{idleLong}, CodeAccepted, 0},
		{"batch's long prefill behind a queue waits", nil, func(r *Request) { r.Priority, r.PromptTokens = -1, 6000 }, []Option{slow(2500*time.Millisecond, time.Second)}, CodeWaitKV, -1},
		{"batch short prompt on the same queue waits", nil, func(r *Request) { r.Priority = -1 }, []Option{slow(2500*time.Millisecond, time.Second)}, CodeWaitKV, -1},
		{"batch over its own slo", nil, func(r *Request) { r.Priority = -1 }, []Option{slow(40*time.Second, 0)}, CodeSLOUnattainable, -1},
		{"high class default 1s", nil, func(r *Request) { r.Priority = 1 }, []Option{slow(1500*time.Millisecond, 0)}, CodeSLOUnattainable, -1},
		{"tpot over", nil, func(*Request) {}, []Option{slow(100*time.Millisecond, 300*time.Millisecond)}, CodeSLOUnattainable, -1},
		{"second option meets", nil, func(*Request) {}, []Option{slow(5*time.Second, 0), slow(time.Second, 0)}, CodeAccepted, 1},
		{"already waited too long", nil, func(r *Request) { r.Arrived = t0.Add(-1900 * time.Millisecond) }, []Option{slow(200*time.Millisecond, 0)}, CodeSLOUnattainable, -1},
		// An agent step held for its window: the SLO counts from when the window let it in.
		{"slo clock starts after the agent window", nil, func(r *Request) {
			r.Arrived, r.SLOStart = t0.Add(-10*time.Second), t0.Add(-100*time.Millisecond)
		}, []Option{slow(200*time.Millisecond, 0)}, CodeAccepted, 0},
		{"slo clock after the window still counts", nil, func(r *Request) {
			r.Arrived, r.SLOStart = t0.Add(-10*time.Second), t0.Add(-1900*time.Millisecond)
		}, []Option{slow(200*time.Millisecond, 0)}, CodeSLOUnattainable, -1},
		// SCORPIO: 15000 prefill tokens of its tenant with earlier deadlines wait ahead at
		// 10000 tokens/s: 1.5 s + 1 s predicted > 2 s.
		{"queue ahead makes it late", items("t", 3, 0, 5000), func(*Request) {}, []Option{slow(time.Second, 0)}, CodeSLOUnattainable, -1},
		// The same queue drains into two candidates at 20000 tokens/s: 0.75 s + 1 s fits.
		{"queue ahead drains into every candidate", items("t", 3, 0, 5000), func(*Request) {}, []Option{slow(time.Second, 0), slow(time.Second, 0)}, CodeWaitBehind, -1},
		{"queue ahead but loose slo", items("t", 3, 0, 5000), func(r *Request) { r.TTFTSLO = 10 * time.Second }, []Option{slow(time.Second, 0)}, CodeWaitBehind, -1},
		{"queue behind does not count", items("a", 3, -1, 5000), func(*Request) {}, []Option{slow(time.Second, 0)}, CodeAccepted, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAdmitter(t, nil)
			for _, it := range tt.waiting {
				if it.Priority < 0 {
					it.Deadline = t0.Add(time.Hour)
				}
				if _, err := a.Room().Push(t0, it); err != nil {
					t.Fatalf("seeding: %v", err)
				}
			}
			r := baseReq()
			tt.mod(&r)
			d := a.Admit(t0, r, tt.opts)
			if d.Code != tt.code || d.Option != tt.option {
				t.Fatalf("Admit = %+v, want %s option %d", d, tt.code, tt.option)
			}
			if d.Code == CodeSLOUnattainable && (d.Status != 429 || d.Layer != LayerSLO || d.RetryAfter <= 0) {
				t.Errorf("refusal %+v", d)
			}
		})
	}
}

func TestSLOFor(t *testing.T) {
	a := newAdmitter(t, nil)
	for _, tt := range []struct {
		prio       int
		ttft, tpot time.Duration
		wantT      time.Duration
		wantP      time.Duration
	}{
		{0, 0, 0, 2 * time.Second, 200 * time.Millisecond},
		{10, 0, 0, time.Second, 100 * time.Millisecond},
		{-10, 0, 0, 30 * time.Second, 0},
		{0, 5 * time.Second, time.Second, 5 * time.Second, time.Second},
	} {
		gt, gp := a.SLOFor(Request{Priority: tt.prio, TTFTSLO: tt.ttft, TPOTSLO: tt.tpot})
		if gt != tt.wantT || gp != tt.wantP {
			t.Errorf("SLOFor(prio %d) = %v %v, want %v %v", tt.prio, gt, gp, tt.wantT, tt.wantP)
		}
	}
}

// TestRecheck: the owner judges its own engine and leaves its waiting room out; the room's
// queue is what this node holds as an ingress, and the forwarding ingress ordered the request
// against its own.
func TestRecheck(t *testing.T) {
	slow := func(ttft time.Duration, free int) Option {
		o := idle()
		o.PredictedTTFT, o.FreeKVBlocks = ttft, free
		return o
	}
	tests := []struct {
		name string
		mod  func(*Request)
		o    Option
		code string
	}{
		{"room ahead is not counted", func(*Request) {}, slow(time.Second, 1000), CodeAccepted},
		{"engine too slow", func(*Request) {}, slow(3*time.Second, 1000), CodeSLOUnattainable},
		{"waited at the ingress counts", func(r *Request) { r.Arrived = t0.Add(-1500 * time.Millisecond) }, slow(time.Second, 1000), CodeSLOUnattainable},
		{"no kv room", func(*Request) {}, slow(time.Second, 0), CodeWaitKV},
		{"batch only on spare capacity", func(r *Request) { r.Priority = -1 }, slow(20*time.Second, 1000), CodeWaitKV},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAdmitter(t, func(c *Config) { c.Queue.MaxRequests = 3 })
			// A full room of its tenant's equal-rank work with earlier deadlines: Admit would
			// make the request wait behind it (or shed it), and price 15000 tokens ahead of it.
			for _, it := range items("t", 3, 0, 5000) {
				if _, err := a.Room().Push(t0, it); err != nil {
					t.Fatalf("seeding: %v", err)
				}
			}
			r := baseReq()
			r.Arrived = t0.Add(time.Millisecond)
			tt.mod(&r)
			if d := a.Admit(t0.Add(time.Millisecond), r, []Option{tt.o}); d.Action == Accept {
				t.Fatalf("Admit with the room = %+v, want no accept", d)
			}
			d := a.Recheck(t0.Add(time.Millisecond), r, tt.o)
			if d.Code != tt.code {
				t.Fatalf("Recheck = %+v, want %s", d, tt.code)
			}
			if n, _ := a.Room().Waiting("m", ""); n != 3 {
				t.Errorf("room holds %d, want the 3 seeded: Recheck never queues", n)
			}
		})
	}
}

// TestFeasible pins layer 7's prediction on one option: its TTFT estimate plus the time waited
// (never negative) plus the queue ahead against the TTFT target, its TPOT against the TPOT
// target; a zero target is not checked.
func TestFeasible(t *testing.T) {
	o := Option{PredictedTTFT: time.Second, PredictedTPOT: 300 * time.Millisecond}
	ms := time.Millisecond
	tests := []struct {
		name             string
		ahead, waited    time.Duration
		ttftSLO, tpotSLO time.Duration
		wantTTFT         time.Duration
		wantOK           bool
	}{
		{"meets", 500 * ms, 400 * ms, 2 * time.Second, 0, 1900 * ms, true},
		{"waited too long", 500 * ms, 600 * ms, 2 * time.Second, 0, 2100 * ms, false},
		{"negative wait counts as none", 500 * ms, -time.Second, 1500 * ms, 0, 1500 * ms, true},
		{"no TTFT target", 9 * time.Second, 0, 0, 0, 10 * time.Second, true},
		{"TPOT over", 0, 0, 2 * time.Second, 200 * ms, time.Second, false},
		{"TPOT within", 0, 0, 2 * time.Second, 300 * ms, time.Second, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ttft, ok := feasible(o, tt.ahead, tt.waited, tt.ttftSLO, tt.tpotSLO)
			if ttft != tt.wantTTFT || ok != tt.wantOK {
				t.Fatalf("feasible = %v %v, want %v %v", ttft, ok, tt.wantTTFT, tt.wantOK)
			}
		})
	}
}

// TestSpare pins where sheddable work may start: where its predicted TTFT is within half the
// normal class's 2 s, or, for a prompt whose own prefill is longer, where under a tenth of it
// (0.2 s) is queued ahead of it. Other priorities always may.
func TestSpare(t *testing.T) {
	a := newAdmitter(t, nil)
	opt := func(ttft time.Duration, rate float64, cached int) Option {
		return Option{PredictedTTFT: ttft, PrefillTokensPerSecond: rate, CachedTokens: cached}
	}
	tests := []struct {
		name     string
		priority int
		prompt   int
		o        Option
		want     bool
	}{
		{"normal always", 0, 100, opt(20*time.Second, 0, 0), true},
		{"batch within half the normal TTFT", -1, 100, opt(time.Second, 0, 0), true},
		{"batch past it", -1, 100, opt(1500*time.Millisecond, 0, 0), false},
		// 8000 tokens at 3400/s are 2.35 s of the 2.5 s predicted: 0.15 s ahead.
		{"batch's own long prefill, little ahead", -1, 8000, opt(2500*time.Millisecond, 3400, 0), true},
		// 6800 tokens are 2 s of the 2.3 s predicted: 0.3 s ahead, past a tenth.
		{"batch's own long prefill, 0.3 s ahead", -1, 6800, opt(2300*time.Millisecond, 3400, 0), false},
		// 2000 of them cached: 1.76 s its own, 0.74 s ahead.
		{"batch's long prefill, cached part not its own", -1, 8000, opt(2500*time.Millisecond, 3400, 2000), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := a.spare(tt.priority, tt.prompt, tt.o); got != tt.want {
				t.Fatalf("spare = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestQueuePricing pins the figures layer 7 and the default TTFT target are built from: the
// prefill a request brings (its prompt less the longest cached prefix), its own prefill time at
// the options' mean rate, and the room's queue ahead at their combined rate.
func TestQueuePricing(t *testing.T) {
	rates := func(rs ...float64) []Option {
		out := make([]Option, len(rs))
		for i, r := range rs {
			out[i].PrefillTokensPerSecond = r
		}
		return out
	}
	cached := []Option{{CachedTokens: 30}, {CachedTokens: 80}}
	for _, tt := range []struct {
		name      string
		got, want any
	}{
		{"prefill less the longest prefix", prefillTokens(100, cached), 20},
		{"prefill of a prompt wholly cached", prefillTokens(50, cached), 0},
		{"own prefill at the mean rate", ownTTFT(10000, rates(10000, 0, 30000)), 500 * time.Millisecond},
		{"own prefill, no rate known", ownTTFT(10000, rates(0)), time.Duration(0)},
		{"own prefill of nothing", ownTTFT(0, rates(10000)), time.Duration(0)},
		{"queue ahead at the combined rate", aheadWait(15000, rates(10000, 10000)), 750 * time.Millisecond},
		{"a negative rate is left out", aheadWait(15000, rates(10000, -5)), 1500 * time.Millisecond},
		{"no queue ahead", aheadWait(0, rates(10000)), time.Duration(0)},
		{"queue ahead, no rate known", aheadWait(15000, rates(0)), time.Duration(0)},
	} {
		if tt.got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, tt.got, tt.want)
		}
	}
}

// TestTTL pins that X-Kvmesh-Queue-TTL may only shorten the queue TTL.
func TestTTL(t *testing.T) {
	a := newAdmitter(t, nil) // Queue.TTL 60 s
	for _, tt := range []struct{ header, want time.Duration }{
		{0, time.Minute},
		{10 * time.Second, 10 * time.Second},
		{2 * time.Minute, time.Minute},
	} {
		if got := a.TTL(Request{QueueTTL: tt.header}); got != tt.want {
			t.Errorf("TTL with header %v = %v, want %v", tt.header, got, tt.want)
		}
	}
}
