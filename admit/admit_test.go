package admit

import (
	"errors"
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

func items(prefix string, n, prio, tokens int) []*Item {
	out := make([]*Item, n)
	for i := range out {
		out[i] = &Item{ID: prefix + string(rune('0'+i)), Model: "m", Tenant: prefix, Priority: prio, Tokens: tokens,
			Arrived: t0, Deadline: t0.Add(time.Duration(i) * time.Millisecond)}
	}
	return out
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
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
