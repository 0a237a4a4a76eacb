package admit

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestDecodeForecast pins F(t_a): used blocks drain at the rate a request's residence
// (E[out] steps) releases them, and the halves in flight take theirs.
func TestDecodeForecast(t *testing.T) {
	const out = 100 // E[out]; with a 10 ms step a request stays 1 s
	tests := []struct {
		name string
		f    DecodeForecast
		want int
	}{
		{"idle", DecodeForecast{Total: 1000, Step: 10 * time.Millisecond, Arrive: 500 * time.Millisecond}, 1000},
		{"full now, drained by the arrival (anti-phase)", DecodeForecast{Total: 1000, Used: 1000, Step: 10 * time.Millisecond, Arrive: time.Second}, 1000},
		{"full now, a quarter drained", DecodeForecast{Total: 1000, Used: 1000, Step: 10 * time.Millisecond, Arrive: 250 * time.Millisecond}, 250},
		{"empty now, filled by the halves in flight (anti-phase)", DecodeForecast{Total: 1000, InFlight: 950, Step: 10 * time.Millisecond, Arrive: time.Second}, 50},
		{"both", DecodeForecast{Total: 1000, Used: 800, InFlight: 300, Step: 10 * time.Millisecond, Arrive: 250 * time.Millisecond}, 100},
		{"more in flight than room", DecodeForecast{Total: 100, InFlight: 150, Step: 10 * time.Millisecond}, -50},
		{"no step known: used taken as drained", DecodeForecast{Total: 1000, Used: 900, Arrive: time.Millisecond}, 1000},
		{"arrival now: nothing drains", DecodeForecast{Total: 1000, Used: 900, Step: 10 * time.Millisecond}, 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.f.Free(out); got != tt.want {
				t.Errorf("F(t_a) = %d, want %d", got, tt.want)
			}
		})
	}
	// Wait: the load at t_a (used and in flight) releases itself once a residence.
	f := DecodeForecast{Total: 1000, Used: 600, InFlight: 400, Step: 10 * time.Millisecond}
	if w, ok := f.Wait(100, out); !ok || w != 100*time.Millisecond {
		t.Errorf("Wait(100) = %v %v, want 100ms", w, ok)
	}
	if _, ok := (DecodeForecast{Total: 1000, Step: 10 * time.Millisecond}).Wait(1, out); ok {
		t.Error("an idle node is forecast to drain")
	}
}

// pairOpt is a split request's pair whose decode node d1 is forecast by f.
func pairOpt(f DecodeForecast) Option {
	o := idle()
	o.Peer, o.Split = "p1", true
	f.Node = "d1"
	o.Decode, o.TotalKVBlocks, o.FreeKVBlocks = f, f.Total, f.Total-f.Used
	return o
}

// TestPairAdmission pins the decode pool's check before the prefill: admitted on the room
// forecast at the handover's arrival, not now; queued when the room comes in time; refused
// 429 decode_full, with the reason and a Retry-After, when it does not.
func TestPairAdmission(t *testing.T) {
	a := newAdmitter(t, nil)
	req := baseReq() // 100 + 100 tokens: 13 blocks of 16
	step := 10 * time.Millisecond
	tests := []struct {
		name  string
		opts  []Option
		want  Decision // its Action, Code and Option
		pools []string
	}{
		{"decode full now but drained at the arrival: admitted (anti-phase)",
			[]Option{pairOpt(DecodeForecast{Total: 1000, Used: 1000, Step: step, Arrive: 2 * time.Second})},
			Decision{Action: Accept, Code: CodeAccepted, Option: 0}, []string{PoolPrefill, PoolDecode}},
		{"decode empty now but the halves in flight fill it: queued (anti-phase)",
			[]Option{pairOpt(DecodeForecast{Total: 1000, InFlight: 990, Step: step, Arrive: 100 * time.Millisecond})},
			Decision{Action: Queue, Code: CodeWaitDecode, Option: -1}, []string{PoolDecode}},
		{"decode full and slow to drain: refused before the prefill",
			[]Option{pairOpt(DecodeForecast{Total: 1000, Used: 1000, Step: time.Second, Arrive: 100 * time.Millisecond})},
			Decision{Action: Refuse, Code: CodeDecodeFull, Option: -1}, []string{PoolDecode}},
		{"over the decode mark, under the whole request's",
			[]Option{pairOpt(DecodeForecast{Total: 1000, Used: 900, Step: step})},
			Decision{Action: Queue, Code: CodeWaitDecode, Option: -1}, []string{PoolDecode}},
		{"no decode room, a mixed node has: whole",
			[]Option{pairOpt(DecodeForecast{Total: 1000, Used: 1000, Step: time.Second}), idle()},
			Decision{Action: Accept, Code: CodeAccepted, Option: 1}, []string{PoolWhole}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := a.Admit(t0, req, tt.opts)
			if w := tt.want; d.Action != w.Action || d.Code != w.Code || d.Option != w.Option {
				t.Fatalf("%v %s option %d (%s), want %v %s option %d", d.Action, d.Code, d.Option, d.Message, w.Action, w.Code, w.Option)
			}
			if got := d.Pools(); !slices.Equal(got, tt.pools) {
				t.Errorf("pools %v, want %v", got, tt.pools)
			}
			if d.Code == CodeDecodeFull {
				if d.Status != 429 || d.RetryAfter < time.Second || !strings.Contains(d.Message, "decode node d1") {
					t.Errorf("refusal %d after %v: %q", d.Status, d.RetryAfter, d.Message)
				}
			}
		})
	}
}

// TestPoolBudgets pins the separate budgets: a split request waits in the (model, prefill)
// pool, whose token cap is queue.prefill_target_ttft × that pool's prefill rate, while whole
// requests keep the (model, "") pool and its cap; the prefill owner counts the prompt's KV
// only, the decode owner the decode pool's mark.
func TestPoolBudgets(t *testing.T) {
	a := newAdmitter(t, func(c *Config) { c.Queue.PrefillTargetTTFT = Duration(time.Second) })
	a.Room().SetPrefillRate("m", RolePrefill, 1000) // cap 1,000 tokens
	a.Room().SetPrefillRate("m", "", 1000)          // cap 4,000 tokens (queue.target_ttft 4s)
	full := pairOpt(DecodeForecast{Total: 1000, Used: 950, Step: 10 * time.Millisecond})

	req := baseReq()
	req.ID, req.PromptTokens = "split-1", 800
	d := a.Admit(t0, req, []Option{full})
	if d.Action != Queue || d.Role != RolePrefill {
		t.Fatalf("first split request: %v %s role %q, want queued in the prefill pool", d.Action, d.Code, d.Role)
	}
	if it := a.Item(req, d); it.Role != RolePrefill {
		t.Fatalf("item role %q", it.Role)
	} else if _, err := a.Room().Push(t0, it); err != nil {
		t.Fatal(err)
	}
	req.ID = "split-2"
	if d := a.Admit(t0, req, []Option{full}); d.Code != CodeQueueFull {
		t.Errorf("second split request: %v %s, want queue_full (the prefill pool holds 800 of 1,000 tokens)", d.Action, d.Code)
	}
	busy := idle()
	busy.FreeKVBlocks = 0
	req.ID = "whole"
	if d := a.Admit(t0, req, []Option{busy}); d.Action != Queue || d.Role != "" {
		t.Errorf("whole request: %v %s role %q, want queued in the whole pool", d.Action, d.Code, d.Role)
	}

	// The owners: the prefill half holds the prompt (7 blocks), not its 1,000-token output.
	own := idle()
	own.FreeKVBlocks, own.TotalKVBlocks = 20, 20
	half := baseReq()
	half.MaxTokens, half.Role = ptr(1000), RolePrefill
	if d := a.Recheck(t0, half, own); d.Action != Accept || !slices.Equal(d.Pools(), []string{PoolPrefill}) {
		t.Errorf("prefill owner: %v %s pools %v, want accepted in the prefill pool", d.Action, d.Code, d.Pools())
	}
	half.Role = ""
	if d := a.Recheck(t0, half, own); d.Action == Accept {
		t.Error("a whole request with 1,000 tokens of output fitted 20 blocks")
	}
	// The decode half at 92% after it: under kv.queue_on, over kv.decode_queue_on.
	dec := idle()
	dec.FreeKVBlocks, dec.TotalKVBlocks = 93, 1000
	half = baseReq() // 13 blocks
	half.Role = RoleDecode
	if d := a.Recheck(t0, half, dec); d.Action == Accept || !slices.Equal(d.Pools(), []string{PoolDecode}) {
		t.Errorf("decode owner: %v %s pools %v, want not accepted, in the decode pool", d.Action, d.Code, d.Pools())
	}
	half.Role = ""
	if d := a.Recheck(t0, half, dec); d.Action != Accept {
		t.Errorf("whole request at 92%%: %v %s, want accepted", d.Action, d.Code)
	}
}

// TestPairReadyHysteresis pins the decode pool's lower mark for a queued split request.
func TestPairReadyHysteresis(t *testing.T) {
	a := newAdmitter(t, nil)
	req := baseReq() // 13 blocks
	it := a.Item(req, Decision{Tenant: "t", MaxTokens: 100, ExpectedTokens: 100, Role: RolePrefill})
	at := func(used int) Action {
		return a.Ready(t0, it, []Option{pairOpt(DecodeForecast{Total: 1000, Used: used, Step: 10 * time.Millisecond})}).Action
	}
	if got := at(850); got != Queue { // 86.3% after it: over decode_queue_off 0.8
		t.Errorf("at 86%%: %v, want queue", got)
	}
	if got := at(780); got != Accept {
		t.Errorf("at 79%%: %v, want accept", got)
	}
}

func TestRoleConfig(t *testing.T) {
	for _, tt := range []struct {
		name, json string
	}{
		{"off above on", `{"models":{"m":{"context_tokens":8}},"kv":{"decode_queue_on":0.8,"decode_queue_off":0.9}}`},
		{"on above 1", `{"models":{"m":{"context_tokens":8}},"kv":{"decode_queue_on":1.2}}`},
		{"zero target", `{"models":{"m":{"context_tokens":8}},"queue":{"prefill_target_ttft":0}}`},
	} {
		if _, err := LoadConfig([]byte(tt.json)); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", tt.name, err)
		}
	}
	c, err := LoadConfig([]byte(`{"models":{"m":{"context_tokens":8}}}`))
	if err != nil || c.KV.DecodeQueueOn != 0.9 || c.KV.DecodeQueueOff != 0.8 || c.Queue.PrefillTargetTTFT != Duration(4*time.Second) {
		t.Errorf("defaults %+v %v: %v", c.KV, c.Queue.PrefillTargetTTFT, err)
	}
}

// TestAdapterWaitsInItsBaseModelsPool pins that a LoRA adapter's request waits in its base
// model's pool: the base model's nodes prefill it, so their measured rate sizes its cap, and it
// shares that cap with the base model's requests and the other adapters'.
func TestAdapterWaitsInItsBaseModelsPool(t *testing.T) {
	a := newAdmitter(t, func(c *Config) {
		c.Queue.FallbackTokens = 1 << 20
		c.Models["lora-a"], c.Models["lora-b"] = c.Models["m"], c.Models["m"]
	})
	a.Room().SetPrefillRate("m", "", 1000) // cap 4,000 tokens (queue.target_ttft 4s)
	busy := idle()
	busy.FreeKVBlocks = 0

	req := baseReq()
	req.ID, req.Model, req.Parent, req.PromptTokens = "lora-a-1", "lora-a", "m", 3000
	d := a.Admit(t0, req, []Option{busy})
	if d.Action != Queue {
		t.Fatalf("first adapter request: %v %s, want queued", d.Action, d.Code)
	}
	it := a.Item(req, d)
	if it.Model != "m" {
		t.Fatalf("item pool model %q, want the base model m", it.Model)
	}
	if _, err := a.Room().Push(t0, it); err != nil {
		t.Fatal(err)
	}
	if n, tokens := a.Room().Waiting("m", ""); n != 1 || tokens != 3000 {
		t.Errorf("base pool holds %d requests, %d tokens; want 1, 3000", n, tokens)
	}
	other := baseReq()
	other.ID, other.Model, other.Parent, other.PromptTokens = "lora-b-1", "lora-b", "m", 3000
	if d := a.Admit(t0, other, []Option{busy}); d.Code != CodeQueueFull {
		t.Errorf("another adapter's request: %v %s, want queue_full (the base pool holds 3,000 of 4,000 tokens)", d.Action, d.Code)
	}
}
