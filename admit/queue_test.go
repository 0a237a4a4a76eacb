package admit

import (
	"testing"
	"time"
)

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

// TestRoomSpace pins the room's caps for one more item of 100 prefill tokens, in a pool capped
// at 4 requests and 1000 tokens: a cap is passed when the item would exceed it (the token cap
// not for an item joining an empty pool), and a sheddable item is turned away past half of
// either cap.
func TestRoomSpace(t *testing.T) {
	c := func(n, tokens, cost int) space {
		return space{n: n, tokens: tokens, maxReq: 4, maxTok: 1000, cost: cost}
	}
	for _, tt := range []struct {
		name       string
		s          space
		over, shed bool
	}{
		{"empty", c(0, 0, 100), false, false},
		{"empty, a prompt over the token cap", c(0, 0, 5000), false, false},
		{"at the request cap", c(4, 400, 100), true, true},
		{"under the request cap", c(3, 300, 100), false, true},
		{"past the token cap", c(1, 950, 100), true, true},
		{"at the token cap", c(1, 900, 100), false, true},
		{"under half of both", c(1, 300, 100), false, false},
		{"past half the tokens", c(1, 450, 100), false, true},
	} {
		if over, shed := tt.s.over(tt.s.n, tt.s.tokens), tt.s.shed(0.5); over != tt.over || shed != tt.shed {
			t.Errorf("%s: over %v shed %v, want %v %v", tt.name, over, shed, tt.over, tt.shed)
		}
	}
}
