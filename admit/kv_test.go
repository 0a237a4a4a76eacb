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

// TestKVRoom pins layer 4's rule on one option of 1000 blocks (unknown total: only the free
// blocks count): use after the request at or under the stage's mark, the sheddable mark 0.75
// for batch, and a request larger than its share on its own only where under a tenth is used.
func TestKVRoom(t *testing.T) {
	a := newAdmitter(t, nil)
	opt := func(free, total int) Option { return Option{FreeKVBlocks: free, TotalKVBlocks: total} }
	tests := []struct {
		name     string
		priority int
		o        Option
		need     int
		mark     float64
		want     bool
	}{
		{"under queue_on", 0, opt(100, 1000), 13, 0.95, true},
		{"exactly at queue_on", 0, opt(63, 1000), 13, 0.95, true},
		{"over queue_on", 0, opt(60, 1000), 13, 0.95, false},
		{"over the dispatch mark", 0, opt(100, 1000), 13, 0.85, false},
		{"more than is free", 0, opt(10, 1000), 13, 0.95, false},
		{"unknown total, fits", 0, opt(13, 0), 13, 0.95, true},
		{"unknown total, does not fit", 0, opt(12, 0), 13, 0.95, false},
		{"batch under sheddable", -1, opt(300, 1000), 13, 0.95, true},
		{"batch over sheddable", -1, opt(100, 1000), 13, 0.95, false},
		{"large batch on an idle pool", -1, opt(1000, 1000), 757, 0.95, true},
		{"large batch under a tenth in use", -1, opt(950, 1000), 757, 0.95, true},
		{"large batch over a tenth in use", -1, opt(850, 1000), 757, 0.95, false},
		{"past the mark alone, idle pool", 0, opt(1000, 1000), 980, 0.95, true},
		{"past the mark alone, a little in use", 0, opt(990, 1000), 980, 0.95, true},
		{"past the mark alone, not enough free", 0, opt(970, 1000), 980, 0.95, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := a.kvRoom(tt.priority, tt.o, tt.need, tt.mark); got != tt.want {
				t.Fatalf("kvRoom(prio %d, free %d of %d, need %d, mark %v) = %v, want %v",
					tt.priority, tt.o.FreeKVBlocks, tt.o.TotalKVBlocks, tt.need, tt.mark, got, tt.want)
			}
		})
	}
}

// TestBlocks pins the KV a request holds on an option: its whole prompt plus expected output,
// cached prefix included, in the option's block size (else the model's, else 16); the prefill
// half an owner checks holds its prompt only.
func TestBlocks(t *testing.T) {
	a := newAdmitter(t, func(c *Config) { c.Models["wide"] = ModelConfig{ContextTokens: 8192, BlockTokens: 32} })
	tests := []struct {
		name     string
		model    string
		role     string
		expected int
		o        Option
		want     int
	}{
		{"prompt and output", "m", "", 100, Option{BlockTokens: 16}, 13},
		{"cached prefix still held", "m", "", 100, Option{BlockTokens: 16, CachedTokens: 96}, 13},
		{"option's block size", "m", "", 100, Option{BlockTokens: 64}, 4},
		{"model's block size", "wide", "", 100, Option{}, 7},
		{"default block size", "m", "", 100, Option{}, 13},
		{"prefill half: prompt only", "m", RolePrefill, 100, Option{BlockTokens: 16}, 7},
		{"prefill role on a pair: output too", "m", RolePrefill, 100, Option{BlockTokens: 16, Split: true}, 13},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := baseReq() // 100 prompt tokens
			r.Model, r.Role = tt.model, tt.role
			if got := a.blocks(r, tt.expected, tt.o); got != tt.want {
				t.Fatalf("blocks = %d, want %d", got, tt.want)
			}
		})
	}
}
