package admit

import (
	"testing"
	"time"
)

// TestDefaultTTFTFitsTheRequest pins the SLO rule: a request that names no TTFT SLO gets its
// class's target plus the time its own uncached prompt takes to prefill at the mean measured
// rate of its candidates; an explicit target keeps its hard meaning; the first decision fixes
// the fitted part and the request keeps it.
func TestDefaultTTFTFitsTheRequest(t *testing.T) {
	opt := func(name string, rate float64, cached int) Option {
		return Option{Peer: name, PredictedTTFT: 100 * time.Millisecond, FreeKVBlocks: 100000, TotalKVBlocks: 100000,
			BlockTokens: 16, CachedTokens: cached, PrefillTokensPerSecond: rate}
	}
	tests := []struct {
		name    string
		req     func(*Request)
		opts    []Option
		wantOwn time.Duration
		want    time.Duration // SLOFor's TTFT after the decision
	}{
		{"no SLO: the class target plus its own prefill", nil, []Option{opt("a", 10000, 0)}, 5 * time.Second, 7 * time.Second},
		{"the mean rate of the candidates", nil, []Option{opt("a", 10000, 0), opt("b", 40000, 0)}, 2 * time.Second, 4 * time.Second},
		{"a cached prefix is not its own work", nil, []Option{opt("a", 10000, 40000)}, time.Second, 3 * time.Second},
		{"no rate known: the class target", nil, []Option{opt("a", 0, 0)}, 0, 2 * time.Second},
		{"high class", func(r *Request) { r.Priority = 1 }, []Option{opt("a", 10000, 0)}, 5 * time.Second, 6 * time.Second},
		{"explicit target: hard", func(r *Request) { r.TTFTSLO = 3 * time.Second }, []Option{opt("a", 10000, 0)}, 5 * time.Second, 3 * time.Second},
		{"kept from the first decision", func(r *Request) { r.OwnTTFT = 500 * time.Millisecond }, []Option{opt("a", 10000, 0)}, 500 * time.Millisecond, 2500 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAdmitter(t, func(c *Config) { c.Models["m"] = ModelConfig{ContextTokens: 131072} })
			r := baseReq()
			r.PromptTokens = 50000
			if tt.req != nil {
				tt.req(&r)
			}
			d := a.Admit(t0, r, tt.opts)
			if d.OwnTTFT != tt.wantOwn {
				t.Fatalf("OwnTTFT = %v, want %v (%+v)", d.OwnTTFT, tt.wantOwn, d)
			}
			it := a.Item(r, d)
			if got, _ := a.SLOFor(it.Req); got != tt.want {
				t.Errorf("SLOFor = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestRefusedForContentionNotSize: on an idle engine a long prompt with the default target is
// served (its target grows with its prefill), and one whose KV need is past the admission
// mark starts where next to nothing runs; the same requests wait or are refused when work is
// queued or running ahead of them, and an explicit target a lone engine cannot meet is refused.
func TestRefusedForContentionNotSize(t *testing.T) {
	a := newAdmitter(t, func(c *Config) { c.Models["m"] = ModelConfig{ContextTokens: 131072} })
	idleBig := Option{Peer: "n", PredictedTTFT: 2300 * time.Millisecond, PredictedTPOT: 20 * time.Millisecond,
		FreeKVBlocks: 8192, TotalKVBlocks: 8192, BlockTokens: 16, PrefillTokensPerSecond: 31000}
	long := baseReq()
	long.PromptTokens = 70000
	if d := a.Admit(t0, long, []Option{idleBig}); d.Action != Accept {
		t.Errorf("70k-token prompt, idle engine: %v %s (%s), want accept", d.Action, d.Code, d.Message)
	}
	hard := long
	hard.TTFTSLO = 2 * time.Second
	if d := a.Admit(t0, hard, []Option{idleBig}); d.Code != CodeSLOUnattainable {
		t.Errorf("70k-token prompt with an explicit 2 s target: %v %s, want slo_unattainable", d.Action, d.Code)
	}
	queued := idleBig
	queued.PredictedTTFT += 5 * time.Second // 155k tokens of prefill queued ahead
	if d := a.Admit(t0, long, []Option{queued}); d.Code != CodeSLOUnattainable {
		t.Errorf("70k-token prompt behind 5 s of queued prefill: %v %s, want slo_unattainable", d.Action, d.Code)
	}

	huge := baseReq()
	huge.PromptTokens, huge.MaxTokens = 125000, ptr(1000) // 7,875 of 8,192 blocks: 96%, past the 95% mark
	idleHuge := idleBig
	idleHuge.PredictedTTFT = 4100 * time.Millisecond
	if d := a.Admit(t0, huge, []Option{idleHuge}); d.Action != Accept {
		t.Errorf("125k-token prompt, idle engine: %v %s (%s), want accept", d.Action, d.Code, d.Message)
	}
	busy := idleHuge
	busy.FreeKVBlocks = 8192 - 1000 // 12% in use
	if d := a.Admit(t0, huge, []Option{busy}); d.Action != Queue {
		t.Errorf("125k-token prompt, engine 12%% in use: %v %s, want queue", d.Action, d.Code)
	}
}

// TestSplitItemRunWholeHoldsItsWholeKV pins that a request queued in the prefill pool (its
// first option a pair) and later taken by a whole candidate is checked and reserved on its
// whole KV, output included, and counted in the whole pool.
func TestSplitItemRunWholeHoldsItsWholeKV(t *testing.T) {
	a := newAdmitter(t, nil)
	r := baseReq()
	r.PromptTokens, r.MaxTokens = 1600, ptr(800)
	it := a.Item(r, Decision{Action: Queue, Role: RolePrefill, Tenant: "t", MaxTokens: 800, ExpectedTokens: 800})
	if it.Role != RolePrefill || it.Req.Role != "" {
		t.Fatalf("item pool %q, request role %q: want the prefill pool and the ingress's role", it.Role, it.Req.Role)
	}
	whole := Option{Peer: "m", PredictedTTFT: 100 * time.Millisecond, FreeKVBlocks: 100000, TotalKVBlocks: 100000, BlockTokens: 16}
	d := a.Ready(t0, it, []Option{whole})
	if d.Action != Accept || d.KVBlocks != (1600+800)/16 || d.Role != "" {
		t.Fatalf("run whole: %v, %d blocks, pool %q; want accept, %d blocks, the whole pool", d.Action, d.KVBlocks, d.Role, (1600+800)/16)
	}
}
