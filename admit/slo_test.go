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
