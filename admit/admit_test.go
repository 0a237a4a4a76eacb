package admit

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

func ptr[T any](v T) *T { return &v }

func testConfig() Config {
	c := DefaultConfig()
	c.Models = map[string]ModelConfig{
		"m":     {ContextTokens: 8192},
		"small": {ContextTokens: 2048, BlockTokens: 16, DefaultMaxTokens: 256, MaxMaxTokens: 512},
	}
	c.Tenants = map[string]TenantConfig{"tight": {DefaultMaxTokens: 64, MaxMaxTokens: 128}}
	return c
}

func newAdmitter(t *testing.T, mutate func(*Config)) *Admitter {
	t.Helper()
	c := testConfig()
	if mutate != nil {
		mutate(&c)
	}
	a, err := New(c)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return a
}

func baseReq() Request {
	return Request{ID: "r", Model: "m", Endpoint: "chat", PromptTokens: 100, MaxTokens: ptr(100), Tenant: "t", Arrived: t0}
}

// idle is a roomy candidate that meets every default SLO.
func idle() Option {
	return Option{Peer: "n1", PredictedTTFT: 100 * time.Millisecond, PredictedTPOT: 20 * time.Millisecond,
		FreeKVBlocks: 1000, TotalKVBlocks: 1000, BlockTokens: 16, PrefillTokensPerSecond: 10000}
}

func TestValidate(t *testing.T) {
	a := newAdmitter(t, func(c *Config) { c.Validation.MaxN = 2 })
	tests := []struct {
		name      string
		mod       func(*Request)
		status    int
		code      string
		param     string
		wantRefus bool
	}{
		{"ok", func(*Request) {}, 0, CodeAccepted, "", false},
		{"unknown model", func(r *Request) { r.Model = "gpt-9" }, 404, CodeModelNotFound, "model", true},
		{"n 2 allowed", func(r *Request) { r.N = ptr(2) }, 0, CodeAccepted, "", false},
		{"n 3", func(r *Request) { r.N = ptr(3) }, 400, CodeInvalidParameter, "n", true},
		{"n 0", func(r *Request) { r.N = ptr(0) }, 400, CodeInvalidParameter, "n", true},
		{"stop 4", func(r *Request) { r.StopCount = 4 }, 0, CodeAccepted, "", false},
		{"stop 5", func(r *Request) { r.StopCount = 5 }, 400, CodeInvalidParameter, "stop", true},
		{"max_tokens 0", func(r *Request) { r.MaxTokens = ptr(0) }, 400, CodeInvalidParameter, "max_tokens", true},
		{"temperature 2", func(r *Request) { r.Temperature = ptr(2.0) }, 0, CodeAccepted, "", false},
		{"temperature 2.1", func(r *Request) { r.Temperature = ptr(2.1) }, 400, CodeInvalidParameter, "temperature", true},
		{"temperature NaN", func(r *Request) { r.Temperature = ptr(math.NaN()) }, 400, CodeInvalidParameter, "temperature", true},
		{"temperature negative", func(r *Request) { r.Temperature = ptr(-0.1) }, 400, CodeInvalidParameter, "temperature", true},
		{"top_p 1.5", func(r *Request) { r.TopP = ptr(1.5) }, 400, CodeInvalidParameter, "top_p", true},
		{"logprobs 20", func(r *Request) { r.Logprobs = ptr(20) }, 0, CodeAccepted, "", false},
		{"logprobs 21", func(r *Request) { r.Logprobs = ptr(21) }, 400, CodeInvalidParameter, "logprobs", true},
		{"priority out of range", func(r *Request) { r.Priority = 5000 }, 400, CodeInvalidParameter, "priority", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := baseReq()
			tt.mod(&r)
			d := a.Validate(r)
			if d.Refused() != tt.wantRefus || d.Status != tt.status || d.Code != tt.code || d.Param != tt.param {
				t.Fatalf("Validate = %+v, want refused=%v status %d code %s param %q", d, tt.wantRefus, tt.status, tt.code, tt.param)
			}
			if d.Layer != LayerValidation {
				t.Errorf("layer %q", d.Layer)
			}
		})
	}
}

func TestModelInfo(t *testing.T) {
	a := newAdmitter(t, func(c *Config) {
		c.Models = nil
		c.ModelInfo = func(m string) (int, bool) { return 1000, m == "gossiped" }
	})
	r := baseReq()
	r.Model = "gossiped"
	if d := a.Validate(r); d.Refused() {
		t.Fatalf("gossiped model refused: %+v", d)
	}
	r.MaxTokens = ptr(950)
	if d := a.Admit(t0, r, []Option{idle()}); d.Code != CodeContextLengthExceeded {
		t.Fatalf("context from ModelInfo not used: %+v", d)
	}
	r.Model = "m"
	if d := a.Validate(r); d.Code != CodeModelNotFound {
		t.Fatalf("model unknown to ModelInfo accepted: %+v", d)
	}
	if _, err := New(Config{}); !errors.Is(err, ErrConfig) {
		t.Fatalf("New without models: %v", err)
	}
}

func keyedAdmitter(t *testing.T) *Admitter {
	t.Helper()
	a := newAdmitter(t, nil)
	entries := []KeyEntry{
		{SHA256: HashKey("alice-key"), Tenant: "alice", Rate: 100, Burst: 1000},
		{SHA256: HashKey("bob-key"), Tenant: "bob", Rate: 100, Burst: 1000},
		{SHA256: HashKey("free-key"), Tenant: "free"},
	}
	if err := a.Keys().Replace(entries, t0); err != nil {
		t.Fatal(err)
	}
	return a
}

func TestIdentify(t *testing.T) {
	open := newAdmitter(t, nil)
	r := baseReq()
	r.Tenant = "forged"
	if tenant, d := open.Identify(t0, r); d.Refused() || tenant != "default" {
		t.Fatalf("open mode: tenant %q, %+v", tenant, d)
	}
	a := keyedAdmitter(t)
	tests := []struct {
		name   string
		key    string
		tenant string
		code   string
	}{
		{"missing", "", "", CodeInvalidAPIKey},
		{"wrong", "mallory", "", CodeInvalidAPIKey},
		{"hash itself is not a key", HashKey("alice-key"), "", CodeInvalidAPIKey},
		{"alice", "alice-key", "alice", CodeAccepted},
		{"unlimited", "free-key", "free", CodeAccepted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := baseReq()
			r.APIKey = tt.key
			r.Tenant = "forged"
			tenant, d := a.Identify(t0, r)
			if tenant != tt.tenant || d.Code != tt.code {
				t.Fatalf("Identify = %q, %+v; want %q %s", tenant, d, tt.tenant, tt.code)
			}
			if d.Refused() && (d.Status != 401 || d.Layer != LayerIdentity) {
				t.Errorf("refusal %+v", d)
			}
		})
	}
}

// TestRateLimitPerKey pins down that the bucket is the key's, whatever else the request says:
// tenant, priority, agent, id and SLO fields (all header-driven) do not move it, and another
// key is not charged.
func TestRateLimitPerKey(t *testing.T) {
	a := keyedAdmitter(t)
	mk := func(key string, i int) Request {
		r := baseReq()
		r.APIKey, r.PromptTokens, r.MaxTokens = key, 300, ptr(300) // cost 600 of a 1000 burst
		r.ID = strings.Repeat("x", i+1)
		r.Tenant, r.Priority, r.Agent, r.TTFTSLO = "t"+r.ID, i%3-1, "agent"+r.ID, time.Duration(i+1)*time.Second
		return r
	}
	if _, d := a.Identify(t0, mk("alice-key", 0)); d.Refused() {
		t.Fatalf("first request refused: %+v", d)
	}
	for i := 1; i < 5; i++ {
		_, d := a.Identify(t0, mk("alice-key", i))
		if d.Code != CodeRateLimited || d.Status != 429 {
			t.Fatalf("request %d with other fields not limited: %+v", i, d)
		}
		// 400 tokens left, 600 needed, 100 tokens/s: 2 s.
		if d.RetryAfter < 1900*time.Millisecond || d.RetryAfter > 2100*time.Millisecond {
			t.Errorf("RetryAfter %v, want about 2s", d.RetryAfter)
		}
	}
	if _, d := a.Identify(t0, mk("bob-key", 0)); d.Refused() {
		t.Fatalf("bob charged for alice: %+v", d)
	}
	// Refused attempts must not have consumed tokens: after 2 s alice fits again.
	if _, d := a.Identify(t0.Add(2*time.Second), mk("alice-key", 9)); d.Refused() {
		t.Fatalf("alice still limited after the advertised wait: %+v", d)
	}
	// Through Check too: the whole pipeline honours the bucket.
	r := mk("alice-key", 10)
	if d := a.Check(t0.Add(2*time.Second), r, []Option{idle()}); d.Code != CodeRateLimited {
		t.Fatalf("Check ignored the bucket: %+v", d)
	}
}

func TestBudget(t *testing.T) {
	a := newAdmitter(t, nil)
	clamp := newAdmitter(t, func(c *Config) { c.Budget.ClampMaxTokens = true })
	tests := []struct {
		name   string
		a      *Admitter
		mod    func(*Request)
		code   string
		maxTok int
	}{
		{"given", a, func(*Request) {}, CodeAccepted, 100},
		{"default filled", a, func(r *Request) { r.MaxTokens = nil }, CodeAccepted, 1024},
		{"default cut to context", a, func(r *Request) { r.MaxTokens, r.PromptTokens = nil, 7800 }, CodeAccepted, 392},
		{"model default", a, func(r *Request) { r.MaxTokens, r.Model = nil, "small" }, CodeAccepted, 256},
		{"tenant default", a, func(r *Request) { r.MaxTokens, r.Tenant = nil, "tight" }, CodeAccepted, 64},
		{"model max refused", a, func(r *Request) { r.Model, r.MaxTokens = "small", ptr(600) }, CodeInvalidParameter, 0},
		{"tenant max refused", a, func(r *Request) { r.Tenant, r.MaxTokens = "tight", ptr(129) }, CodeInvalidParameter, 0},
		{"tenant max clamped", clamp, func(r *Request) { r.Tenant, r.MaxTokens = "tight", ptr(1000) }, CodeAccepted, 128},
		{"context exceeded", a, func(r *Request) { r.PromptTokens, r.MaxTokens = 8000, ptr(500) }, CodeContextLengthExceeded, 0},
		{"prompt alone exceeds", a, func(r *Request) { r.PromptTokens, r.MaxTokens = 9000, nil }, CodeContextLengthExceeded, 0},
		{"exactly full", a, func(r *Request) { r.PromptTokens, r.MaxTokens = 8000, ptr(192) }, CodeAccepted, 192},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := baseReq()
			tt.mod(&r)
			d := tt.a.Admit(t0, r, []Option{idle()})
			if d.Code != tt.code {
				t.Fatalf("Admit = %+v, want %s", d, tt.code)
			}
			if d.Refused() {
				if d.Status != 400 || d.Layer != LayerBudget || d.Param != "max_tokens" {
					t.Errorf("refusal %+v", d)
				}
				return
			}
			if d.MaxTokens != tt.maxTok || d.ExpectedTokens != tt.maxTok {
				t.Errorf("MaxTokens %d Expected %d, want %d (no samples yet: worst case)", d.MaxTokens, d.ExpectedTokens, tt.maxTok)
			}
		})
	}
}

// TestOutputEstimate pins down that learned output lengths replace max_tokens in the KV
// reservation once confident, per tenant with the model as fallback.
func TestOutputEstimate(t *testing.T) {
	a := newAdmitter(t, nil)
	r := baseReq()
	r.MaxTokens = ptr(4000)
	if d := a.Admit(t0, r, []Option{idle()}); d.ExpectedTokens != 4000 {
		t.Fatalf("no samples: expected %d, want the worst case 4000", d.ExpectedTokens)
	}
	for i := range 19 {
		a.Observe("m", "t", 190+i%3*10) // 190..210
	}
	if d := a.Admit(t0, r, []Option{idle()}); d.ExpectedTokens != 4000 {
		t.Fatalf("19 samples: expected %d, want still 4000", d.ExpectedTokens)
	}
	a.Observe("m", "t", 200)
	d := a.Admit(t0, r, []Option{idle()})
	if d.ExpectedTokens < 200 || d.ExpectedTokens > 240 {
		t.Fatalf("20 samples around 200: expected %d", d.ExpectedTokens)
	}
	if d.KVBlocks != (100+d.ExpectedTokens+15)/16 {
		t.Errorf("KV blocks %d not from the estimate %d", d.KVBlocks, d.ExpectedTokens)
	}
	// Another tenant falls back to the model's series; a tiny max_tokens stays the cap.
	r.Tenant = "other"
	if d := a.Admit(t0, r, []Option{idle()}); d.ExpectedTokens > 240 {
		t.Errorf("other tenant: expected %d, want the model's estimate", d.ExpectedTokens)
	}
	r.MaxTokens = ptr(50)
	if d := a.Admit(t0, r, []Option{idle()}); d.ExpectedTokens != 50 {
		t.Errorf("expected %d above max_tokens 50", d.ExpectedTokens)
	}
}

func TestKVStage(t *testing.T) {
	a := newAdmitter(t, nil)
	withFree := func(free, total int) Option { o := idle(); o.FreeKVBlocks, o.TotalKVBlocks = free, total; return o }
	// baseReq needs ceil((100+100)/16) = 13 blocks.
	tests := []struct {
		name   string
		opts   []Option
		action Action
		code   string
		option int
		status int
	}{
		{"fits", []Option{withFree(100, 1000)}, Accept, CodeAccepted, 0, 0},
		{"first full, second fits", []Option{withFree(5, 1000), withFree(500, 1000)}, Accept, CodeAccepted, 1, 0},
		{"free but over queue_on", []Option{withFree(60, 1000)}, Queue, CodeWaitKV, -1, 0},
		{"exactly at queue_on", []Option{withFree(63, 1000)}, Accept, CodeAccepted, 0, 0},
		{"unknown total", []Option{withFree(13, 0)}, Accept, CodeAccepted, 0, 0},
		{"none fit", []Option{withFree(5, 1000), withFree(0, 1000)}, Queue, CodeWaitKV, -1, 0},
		{"never fits", []Option{withFree(10, 10), withFree(12, 12)}, Refuse, CodeKVBudget, -1, 400},
		{"no candidates", nil, Refuse, CodeNoCapacity, -1, 503},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := a.Admit(t0, baseReq(), tt.opts)
			if d.Action != tt.action || d.Code != tt.code || d.Option != tt.option || d.Status != tt.status {
				t.Fatalf("Admit = %+v, want %v %s option %d status %d", d, tt.action, tt.code, tt.option, tt.status)
			}
			if d.Action == Accept && d.KVBlocks != 13 {
				t.Errorf("KVBlocks %d, want 13", d.KVBlocks)
			}
		})
	}
	// A cached prefix saves prefill, not room: running the request holds its blocks too, so a
	// request whose prefix is cached needs as much free KV as one whose prefix is not.
	o := withFree(100, 1000)
	o.CachedTokens = 96
	if d := a.Admit(t0, baseReq(), []Option{o}); d.KVBlocks != 13 {
		t.Errorf("cached prefix: KVBlocks %d, want ceil((100+100)/16) = 13", d.KVBlocks)
	}
	o = withFree(60, 1000) // after 13 blocks: 953 used, over QueueOn; after 7 it would be 947
	o.CachedTokens = 96
	if d := a.Admit(t0, baseReq(), []Option{o}); d.Action != Queue || d.Code != CodeWaitKV {
		t.Errorf("cached prefix, 60 of 1000 blocks free: %+v, want a wait for KV", d)
	}
}

// TestSheddableKVRoom pins down that sheddable work starts only under KV.Sheddable (0.75), and a
// sheddable request larger than that share on its own only where under a tenth of the pool is
// in use.
func TestSheddableKVRoom(t *testing.T) {
	a := newAdmitter(t, func(c *Config) { c.Models["m"] = ModelConfig{ContextTokens: 32768} })
	withFree := func(free int) Option { o := idle(); o.FreeKVBlocks = free; return o }
	batch := func(prompt int) func(*Request) {
		return func(r *Request) { r.Priority, r.PromptTokens = -1, prompt }
	}
	tests := []struct {
		name string
		mod  func(*Request)
		free int
		want string
	}{
		// baseReq needs 13 of 1000 blocks; a 12,000-token prompt 757, more than 0.75 alone.
		{"normal up to queue_on", func(*Request) {}, 100, CodeAccepted},
		{"batch stops at 0.75", batch(100), 100, CodeWaitKV},
		{"batch under 0.75", batch(100), 300, CodeAccepted},
		{"large batch on an idle pool", batch(12000), 1000, CodeAccepted},
		{"large batch under a tenth in use", batch(12000), 950, CodeAccepted},
		{"large batch over a tenth in use", batch(12000), 850, CodeWaitKV},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := baseReq()
			tt.mod(&r)
			d := a.Admit(t0, r, []Option{withFree(tt.free)})
			if d.Code != tt.want {
				t.Fatalf("Admit: %+v, want %s", d, tt.want)
			}
			if r.Priority >= 0 {
				return
			}
			// The room's dispatch (at queue_off, 0.85, above 0.75) draws the same line for batch.
			it := a.Item(r, Decision{Action: Queue, Tenant: d.Tenant, MaxTokens: d.MaxTokens, ExpectedTokens: d.ExpectedTokens})
			if got := a.Ready(t0, it, []Option{withFree(tt.free)}); (got.Action == Accept) != (tt.want == CodeAccepted) {
				t.Errorf("Ready: %+v, want %s", got, tt.want)
			}
		})
	}
}

func TestQueueStage(t *testing.T) {
	full := func() Option { o := idle(); o.FreeKVBlocks = 0; return o }
	cached := func(o Option, tokens int) Option { o.CachedTokens = tokens; return o }
	tests := []struct {
		name    string
		cfg     func(*Config)
		waiting []*Item // already queued for model m
		mod     func(*Request)
		opts    []Option
		action  Action
		code    string
		layer   string
	}{
		{"queue when kv full", nil, nil, func(*Request) {}, []Option{full()}, Queue, CodeWaitKV, LayerKV},
		{"queue disabled", func(c *Config) { c.Queue.MaxRequests = -1 }, nil, func(*Request) {}, []Option{full()}, Refuse, CodeQueueFull, LayerQueue},
		{"request cap", func(c *Config) { c.Queue.MaxRequests = 2 }, items("a", 2, 0, 10), func(*Request) {}, []Option{full()}, Refuse, CodeQueueFull, LayerQueue},
		{"token cap", func(c *Config) { c.Queue.MaxTokens = 150 }, items("a", 1, 0, 100), func(*Request) {}, []Option{full()}, Refuse, CodeQueueFull, LayerQueue},
		{"cap but evicts lower", func(c *Config) { c.Queue.MaxRequests = 2 }, items("a", 2, 0, 10), func(r *Request) { r.Priority = 3 }, []Option{full()}, Queue, CodeWaitKV, LayerKV},
		{"behind equal rank even with room", nil, items("a", 1, 0, 10), func(*Request) {}, []Option{idle()}, Queue, CodeWaitBehind, LayerPriority},
		{"higher rank overtakes", nil, items("a", 3, 0, 10), func(r *Request) { r.Priority = 5 }, []Option{idle()}, Accept, CodeAccepted, LayerSLO},
		{"other model not blocked", nil, items("a", 3, 0, 10), func(r *Request) { r.Model = "small" }, []Option{idle()}, Accept, CodeAccepted, LayerSLO},
		{"sheddable shed when busy", func(c *Config) { c.Queue.MaxRequests = 4 }, items("a", 2, 0, 10), func(r *Request) { r.Priority = -1 }, []Option{full()}, Refuse, CodeQueueFull, LayerPriority},
		{"sheddable queues when quiet", func(c *Config) { c.Queue.MaxRequests = 4 }, items("a", 1, 0, 10), func(r *Request) { r.Priority = -1; r.TTFTSLO = time.Hour }, []Option{full()}, Queue, CodeWaitKV, LayerKV},
		// The token caps count prefill work: 4000 prompt tokens over a 500-token sheddable cap,
		// but 3800 of them cached on a candidate.
		{"sheddable prompt over the cap is shed", func(c *Config) { c.Queue.MaxTokens = 1000 }, items("a", 1, 0, 10), func(r *Request) { r.Priority, r.PromptTokens, r.TTFTSLO = -1, 4000, time.Hour }, []Option{full()}, Refuse, CodeQueueFull, LayerPriority},
		{"sheddable prompt mostly cached queues", func(c *Config) { c.Queue.MaxTokens = 1000 }, items("a", 1, 0, 10), func(r *Request) { r.Priority, r.PromptTokens, r.TTFTSLO = -1, 4000, time.Hour }, []Option{cached(full(), 3800)}, Queue, CodeWaitKV, LayerKV},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAdmitter(t, tt.cfg)
			for _, it := range tt.waiting {
				if _, err := a.Room().Push(t0, it); err != nil {
					t.Fatalf("seeding: %v", err)
				}
			}
			r := baseReq()
			r.Arrived = t0.Add(time.Millisecond) // after the waiters
			tt.mod(&r)
			d := a.Admit(r.Arrived, r, tt.opts)
			if d.Action != tt.action || d.Code != tt.code || d.Layer != tt.layer {
				t.Fatalf("Admit = %+v, want %v %s at %s", d, tt.action, tt.code, tt.layer)
			}
			if d.Refused() && (d.Status != 429 || d.RetryAfter <= 0) {
				t.Errorf("refusal without 429 and Retry-After: %+v", d)
			}
		})
	}
}

func items(prefix string, n, prio, tokens int) []*Item {
	out := make([]*Item, n)
	for i := range out {
		out[i] = &Item{ID: prefix + string(rune('0'+i)), Model: "m", Tenant: prefix, Priority: prio, Tokens: tokens,
			Arrived: t0, Deadline: t0.Add(time.Duration(i) * time.Millisecond)}
	}
	return out
}

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

func TestLoadConfig(t *testing.T) {
	cfg, err := LoadConfig([]byte(`{"models":{"m":{"context_tokens":4096}},"queue":{"ttl":"30s","drain_window":5,"backfill":-1},
		"tenants":{"acme":{"max_max_tokens":256}},"slo":{"normal":{"ttft":"1.5s","tpot":"1h"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if time.Duration(cfg.Queue.TTL) != 30*time.Second || time.Duration(cfg.Queue.DrainWindow) != 5*time.Second ||
		time.Duration(cfg.SLO.Normal.TTFT) != 1500*time.Millisecond || time.Duration(cfg.SLO.Normal.TPOT) != time.Hour ||
		cfg.Tenants["acme"].MaxMaxTokens != 256 || cfg.Queue.MaxRequests != 1024 || cfg.Queue.Backfill != -1 ||
		cfg.Queue.DispatchSlack != 0.2 {
		t.Fatalf("loaded %+v", cfg)
	}
	// Zero is the default where 0 never meant off (docs/operating.md's example).
	if cfg, err := LoadConfig([]byte(`{"models":{"m":{"context_tokens":4096}},"queue":{"max_total":0}}`)); err != nil || cfg.Queue.MaxTotal != 16384 {
		t.Errorf("queue.max_total 0: %d, %v; want the default 16384", cfg.Queue.MaxTotal, err)
	}
	for _, tt := range []struct{ in, want string }{
		{`{"models":{"m":{"context_tokens":4096}},"bogus":1}`, `unknown key "bogus"`},
		{`{"models":{"m":{"context_tokens":4096}},"queue":{"max_requets":1}}`, `unknown key "queue.max_requets"`},
		{`{"models":{}}`, "no models"},
		{`{"models":{"m":{"context_tokens":4096}},"kv":{"queue_on":0.8,"queue_off":0.9}}`, "kv"},
		{`{"models":{"m":{"context_tokens":4096}},"queue":{"ttl":"-1s"}}`, "queue"},
		{`{"models":{"m":{"context_tokens":4096}},"queue":{"ttl":-1}}`, "queue"},
		{`{"models":{"m":{"context_tokens":4096}},"queue":{"ttl":"soon"}}`, `duration "soon"`},
		{`{"models":{"m":{"context_tokens":4096}},"queue":{"dispatch_slack":1}}`, "dispatch_slack"},
		// Zero once turned these off; now it is the default, so a file that says 0 is stopped.
		{`{"models":{"m":{"context_tokens":4096}},"queue":{"backfill":0}}`, "queue.backfill: 0 is refused, as it once turned the setting off: write -1 to turn it off, or leave the key out for the default (8)"},
		{`{"models":{"m":{"context_tokens":4096}},"queue":{"max_requests":0}}`, "queue.max_requests: 0 is refused, as it once turned the setting off: write -1"},
		{`{"models":{"m":{"context_tokens":4096}},"slo":{"normal":{"tpot":"0"}}}`, `slo.normal.tpot: 0 is refused, as it once turned the setting off, which nothing does now: write the value you want, or leave the key out for the default ("200ms")`},
		{`{"models":{"m":{"context_tokens":4096}},"validation":{"max_stop":0}}`, "validation.max_stop: 0 is refused"},
	} {
		_, err := LoadConfig([]byte(tt.in))
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("LoadConfig(%s) = %v, want an ErrConfig containing %q", tt.in, err, tt.want)
		}
	}
}

// TestConfigNamesMaxPriority pins that keys.max_priority takes a priority's name, as
// --max-priority does, or an integer, and refuses anything else with what to write.
func TestConfigNamesMaxPriority(t *testing.T) {
	for in, want := range map[string]int{`"high"`: PriorityHigh, `"low"`: PriorityLow, `3`: 3} {
		cfg, err := LoadConfig([]byte(`{"models":{"m":{"context_tokens":4096}},"keys":{"max_priority":` + in + `}}`))
		if err != nil || cfg.Keys.MaxPriority == nil || *cfg.Keys.MaxPriority != want {
			t.Errorf("keys.max_priority %s: %v, %v; want %d", in, cfg.Keys.MaxPriority, err, want)
		}
	}
	base := DefaultConfig()
	base.Keys.MaxPriority = new(int)
	cfg, err := DecodeConfig([]byte(`{"keys":{"max_priority":"high","rate_tokens_per_second":5}}`), base)
	if err != nil || *cfg.Keys.MaxPriority != PriorityHigh || cfg.Keys.RateTokens != 5 || *base.Keys.MaxPriority != 0 {
		t.Errorf("over a base: %+v, %v (base %d)", cfg.Keys, err, *base.Keys.MaxPriority)
	}
	if cfg, err = DecodeConfig([]byte(`{"keys":{"burst_tokens":9}}`), base); err != nil || cfg.Keys.MaxPriority == nil || *cfg.Keys.MaxPriority != 0 {
		t.Errorf("a file without max_priority lost the base's: %+v, %v", cfg.Keys, err)
	}
	for in, want := range map[string]string{
		`{"keys":{"max_priority":"urgent"}}`: `max_priority "urgent": want high, normal, low or an integer in [-1000, 1000]`,
		`{"keys":{"max_priority":1.5}}`:      `max_priority "1.5": want`,
		`{"keys":{"max_prio":1}}`:            `unknown key "keys.max_prio"`,
	} {
		if _, err := DecodeConfig([]byte(in), DefaultConfig()); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("DecodeConfig(%s) = %v, want an ErrConfig containing %q", in, err, want)
		}
	}
}

func TestZeroFieldsTakeTheDefaults(t *testing.T) {
	a, err := New(Config{Models: map[string]ModelConfig{"m": {ContextTokens: 4096}}})
	if err != nil {
		t.Fatalf("New with zero layers: %v", err)
	}
	want := DefaultConfig()
	want.Models = a.Config().Models
	if got, _ := json.Marshal(a.Config()); string(got) != string(must(json.Marshal(want))) {
		t.Errorf("New filled\n%s\nwant the defaults\n%s", got, must(json.Marshal(want)))
	}
	r, err := NewWaitingRoom(QueueConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if r.cfg != DefaultConfig().Queue {
		t.Errorf("NewWaitingRoom(QueueConfig{}) kept %+v, want the defaults", r.cfg)
	}
	// Explicit off values survive filling, so filling twice changes nothing.
	c := DefaultConfig()
	c.Queue.Backfill, c.Queue.MaxRequests, c.Queue.DispatchSlack = -1, -1, -1
	if twice := c.WithDefaults().WithDefaults(); twice.Queue != c.Queue {
		t.Errorf("filling changed explicit negatives: %+v", twice.Queue)
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
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

// TestSetConfig pins what SetConfig changes in a running admitter: the SLO classes and the
// waiting room's caps apply at once, the settings whose state is built once keep New's values,
// and an invalid config changes nothing.
func TestSetConfig(t *testing.T) {
	a := newAdmitter(t, nil)
	d := DefaultConfig()
	c := testConfig()
	c.SLO.Normal.TTFT = Duration(500 * time.Millisecond)
	c.Queue.MaxRequests = 1
	c.Queue.DrainWindow = Duration(30 * time.Second)
	c.Budget.EstimateAlpha = 0.5
	c.Keys.RateTokens = 10
	if err := a.SetConfig(c); err != nil {
		t.Fatal(err)
	}
	if ttft, _ := a.SLOFor(Request{}); ttft != 500*time.Millisecond {
		t.Errorf("normal TTFT target %v after SetConfig, want 500ms", ttft)
	}
	if _, err := a.Room().Push(t0, &Item{ID: "a", Model: "m", Tokens: 16, Arrived: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Room().Push(t0, &Item{ID: "b", Model: "m", Tokens: 16, Arrived: t0}); !errors.Is(err, ErrQueueFull) {
		t.Errorf("second waiter under max_requests 1: %v, want ErrQueueFull", err)
	}
	got := a.Config()
	if got.Queue.DrainWindow != d.Queue.DrainWindow || got.Budget.EstimateAlpha != d.Budget.EstimateAlpha || got.Keys.RateTokens != 0 {
		t.Errorf("built-once settings changed: drain window %v, estimate alpha %v, key rate %v",
			got.Queue.DrainWindow, got.Budget.EstimateAlpha, got.Keys.RateTokens)
	}
	bad := c
	bad.KV.QueueOn = 2
	if err := a.SetConfig(bad); !errors.Is(err, ErrConfig) {
		t.Errorf("SetConfig with queue_on 2: %v, want ErrConfig", err)
	}
	if a.Config().KV.QueueOn != d.KV.QueueOn {
		t.Errorf("a rejected config took effect: queue_on %v", a.Config().KV.QueueOn)
	}
}
