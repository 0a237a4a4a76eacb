package admit

import "testing"

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
