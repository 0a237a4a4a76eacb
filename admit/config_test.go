package admit

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

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
		// A file's 0 for these is refused, saying what to write instead.
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

// TestDecodeConfigAtNamesTheFullPath pins that the admission section of a larger file names
// its keys with the section's path: unknown keys and refused zeros alike.
func TestDecodeConfigAtNamesTheFullPath(t *testing.T) {
	for in, want := range map[string]string{
		`{"queue":{"ttll":"1s"}}`:               `unknown key "admission.queue.ttll"`,
		`{"models":{"m":{"context_tokenz":1}}}`: `unknown key "admission.models.m.context_tokenz"`,
		`{"queue":{"backfill":0}}`:              `admission.queue.backfill: 0 is refused`,
	} {
		if _, err := DecodeConfigAt([]byte(in), DefaultConfig(), "admission", nil); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("DecodeConfigAt(%s) = %v, want an ErrConfig containing %q", in, err, want)
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
