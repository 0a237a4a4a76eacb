package sim

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node/engine"
)

// TestPrefillRoleHandsOver pins the prefill role: the request ends once its prompt is
// computed, without a token, and its final chunk carries the handover of the prompt's blocks
// and KV, ready when the last prefill step ends.
func TestPrefillRoleHandsOver(t *testing.T) {
	tests := []struct {
		name   string
		tokens int
		cached int // tokens of the prompt a first request leaves cached
		steps  [][2]int
	}{
		{"one step", 40, 0, [][2]int{{40, 40}}},
		{"chunked", 3000, 0, [][2]int{{2048, 2048}, {952, 3000}}},
		{"cached prefix", 100, 96, [][2]int{{4, 100}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestSim(t, func(c *Config) { c.Role = RolePrefill })
			p := prompt(tt.name, tt.tokens)
			if tt.cached > 0 {
				gen(t, s, &engine.Request{Model: testModel, Prompt: p, MaxTokens: 1})
			}
			before := s.SimTime()
			r := gen(t, s, &engine.Request{Model: testModel, Prompt: p, MaxTokens: 64, Echo: true})
			if r.text != "" || r.chunks != 1 || r.last.FinishReason != engine.FinishHandover {
				t.Fatalf("text %q in %d chunks, finish %q: want one empty handover chunk",
					r.text, r.chunks, r.last.FinishReason)
			}
			if want := (engine.Usage{PromptTokens: tt.tokens, CachedTokens: tt.cached}); *r.last.Usage != want {
				t.Errorf("Usage = %+v, want %+v", *r.last.Usage, want)
			}
			var wantD time.Duration
			for _, st := range tt.steps {
				wantD += stepTime(s.cfg, st[0], st[1])
			}
			blocks := kvindex.AppendBlocks(nil, testModel, p, s.cfg.BlockTokens)
			want := engine.Handover{
				PromptTokens: tt.tokens, CachedTokens: tt.cached,
				KVBytes: int64(tt.tokens) * 128 << 10, ReadyAt: before + wantD,
			}
			h := r.last.Handover
			if h == nil {
				t.Fatal("no handover")
			}
			if !slices.Equal(h.Blocks, blocks) {
				t.Errorf("Blocks = %d hashes, want the prompt's %d", len(h.Blocks), len(blocks))
			}
			if h.PromptTokens != want.PromptTokens || h.CachedTokens != want.CachedTokens ||
				h.KVBytes != want.KVBytes || h.ReadyAt != want.ReadyAt {
				t.Errorf("Handover = %+v, want %+v", *h, want)
			}
			if r.timing.E2E != wantD || r.timing.TTFT != 0 {
				t.Errorf("Timing = %+v, want E2E %v and no first token", r.timing, wantD)
			}
			resident := s.ResidentBlocks()
			for _, b := range blocks {
				if !slices.Contains(resident, b) {
					t.Fatal("the prompt's blocks are not cached after the handover")
				}
			}
			if st := s.State(); st.Running != 0 || st.Waiting != 0 || st.KVBlocksUsed != 0 {
				t.Errorf("State after the handover = %+v, want an idle engine", st)
			}
		})
	}
}

// TestDecodeRoleChargesTransfer pins the decode side: a handover waits exactly its KV bytes
// over the link's bandwidth, then its first token costs one step of the prompt's last token,
// and its text, finish and usage are a mixed engine's for the same request.
func TestDecodeRoleChargesTransfer(t *testing.T) {
	tests := []struct {
		name     string
		role     string
		tokens   int
		linkGBps float64
		seed     uint64
	}{
		{"decode 25 GB/s", RoleDecode, 1000, 0, 7},
		{"decode 100 GB/s", RoleDecode, 1000, 100, 7},
		{"decode short prompt", RoleDecode, 40, 0, 3},
		{"mixed takes a handover", RoleMixed, 500, 0, 11},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := prompt(tt.name, tt.tokens)
			req := func() *engine.Request {
				return &engine.Request{Model: testModel, Prompt: p, MaxTokens: 48, Seed: tt.seed}
			}
			pre := newTestSim(t, func(c *Config) { c.Role = RolePrefill })
			h := gen(t, pre, req()).last.Handover
			// A mixed engine asked for the prefill alone hands over the same record.
			only := req()
			only.PrefillOnly = true
			if mh := gen(t, newTestSim(t, nil), only).last.Handover; mh == nil || mh.PromptTokens != h.PromptTokens ||
				mh.KVBytes != h.KVBytes || mh.ReadyAt != h.ReadyAt {
				t.Fatalf("a mixed engine's prefill-only handover %+v, the prefill engine's %+v", mh, h)
			}
			mixed := gen(t, newTestSim(t, nil), req())

			dec := newTestSim(t, func(c *Config) { c.Role, c.LinkGBps = tt.role, tt.linkGBps })
			dreq := req()
			dreq.Handover = h
			got := gen(t, dec, dreq)

			link := tt.linkGBps
			if link == 0 {
				link = 25 // the default
			}
			xfer := time.Duration(float64(tt.tokens) * 131072 / link) // ns
			if want := xfer + stepTime(dec.cfg, 1, tt.tokens); got.timing.TTFT != want {
				t.Errorf("TTFT = %v, want the transfer %v + one step of the last token", got.timing.TTFT, want)
			}
			if got.timing.Queue != 0 {
				t.Errorf("Queue = %v on an idle engine", got.timing.Queue)
			}
			if got.text != mixed.text || got.last.FinishReason != mixed.last.FinishReason ||
				*got.last.Usage != *mixed.last.Usage {
				t.Errorf("decoded %q (%s, %+v), mixed run %q (%s, %+v)", got.text, got.last.FinishReason,
					*got.last.Usage, mixed.text, mixed.last.FinishReason, *mixed.last.Usage)
			}
		})
	}
}

// TestRoleRefuses pins which requests each role takes.
func TestRoleRefuses(t *testing.T) {
	p := prompt("refuse", 64)
	good := &engine.Handover{PromptTokens: 64}
	tests := []struct {
		name     string
		role     string
		handover *engine.Handover
		ok       bool
		only     bool // Request.PrefillOnly
	}{
		{"mixed plain", RoleMixed, nil, true, false},
		{"mixed handover", RoleMixed, good, true, false},
		{"prefill plain", RolePrefill, nil, true, false},
		{"prefill handover", RolePrefill, good, false, false},
		{"decode plain runs whole", RoleDecode, nil, true, false},
		{"decode handover", RoleDecode, good, true, false},
		{"decode handover of another prompt", RoleDecode, &engine.Handover{PromptTokens: 63}, false, false},
		{"decode negative bytes", RoleDecode, &engine.Handover{PromptTokens: 64, KVBytes: -1}, false, false},
		{"mixed prefill only", RoleMixed, nil, true, true},
		{"prefill prefill only", RolePrefill, nil, true, true},
		{"decode prefill only", RoleDecode, nil, false, true},
		{"mixed prefill only with a handover", RoleMixed, good, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestSim(t, func(c *Config) { c.Role = tt.role })
			st, err := s.submit(context.Background(), &engine.Request{
				Model: testModel, Prompt: p, MaxTokens: 8, Handover: tt.handover, PrefillOnly: tt.only,
			})
			if tt.ok != (err == nil) || (err != nil && !errors.Is(err, engine.ErrRejected)) {
				t.Fatalf("submit = %v, want ok %v (else ErrRejected)", err, tt.ok)
			}
			if st != nil {
				st.Close()
			}
		})
	}
	if _, err := New(Config{Role: "both"}); !errors.Is(err, ErrConfig) {
		t.Errorf("New with role %q = %v, want ErrConfig", "both", err)
	}
}

// TestDecodeOutOfKVQueuesHandover pins that a handover short of blocks waits at the head of
// the queue as a request does, is admitted when the blocks come free, and that one the whole
// pool could never hold is refused as such a request is.
func TestDecodeOutOfKVQueuesHandover(t *testing.T) {
	for _, role := range []string{RoleMixed, RoleDecode} {
		t.Run(role, func(t *testing.T) {
			// 8 blocks: one 80-token prompt (5 blocks) leaves 3, short of the next one's 5.
			s := newTestSim(t, func(c *Config) { c.Role, c.KVBlocks = role, 8 })
			submit := func(tag string, tokens, maxTokens int) (*Stream, error) {
				p := prompt(tag, tokens)
				req := &engine.Request{Model: testModel, Prompt: p, MaxTokens: maxTokens, Seed: fullSeed(t, p, maxTokens)}
				if role == RoleDecode {
					req.Handover = &engine.Handover{PromptTokens: tokens}
				}
				return s.submit(context.Background(), req)
			}
			a, err := submit("a", 80, 48)
			if err != nil {
				t.Fatal(err)
			}
			b, err := submit("b", 80, 48)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := submit("c", 80, 60); !errors.Is(err, engine.ErrRejected) {
				t.Errorf("a request over the pool: %v, want ErrRejected", err)
			}
			step(t, s)
			if running, waiting := queues(s); !slices.Equal(running, []uint64{a.seq.id}) ||
				!slices.Equal(waiting, []uint64{b.seq.id}) {
				t.Fatalf("after one step running %v waiting %v, want [%d] and [%d]",
					running, waiting, a.seq.id, b.seq.id)
			}
			for i := 0; b.seq.state == waiting; i++ {
				if i > 1000 {
					t.Fatal("b never admitted")
				}
				step(t, s)
			}
			if a.seq.state != done {
				t.Errorf("b admitted while a runs: a handover must not overcommit the pool")
			}
			if n := preemptions(s); n != 0 {
				t.Errorf("%d preemptions, want none", n)
			}
		})
	}
}

// TestHandoverPreemptedInTransfer pins that a handover preempted before its KV arrived is
// admitted again as a handover (the transfer starts over), not prefilled, and still decodes
// a mixed engine's text.
func TestHandoverPreemptedInTransfer(t *testing.T) {
	// A slow link keeps a's KV in transfer while b grows out of the 8-block pool.
	s := newTestSim(t, func(c *Config) { c.KVBlocks, c.LinkGBps = 8, 0.001 })
	pb := prompt("b", 16)
	b, err := s.submit(context.Background(), &engine.Request{Model: testModel, Prompt: pb, MaxTokens: 100, Seed: fullSeed(t, pb, 100)})
	if err != nil {
		t.Fatal(err)
	}
	step(t, s) // b prefilled, 1 block
	pa := prompt("a", 80)
	areq := func() *engine.Request {
		return &engine.Request{Model: testModel, Prompt: pa, MaxTokens: 40, Seed: fullSeed(t, pa, 40)}
	}
	req := areq()
	req.Handover = &engine.Handover{PromptTokens: 80}
	a, err := s.submit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; preemptions(s) == 0; i++ {
		if i > 1000 || a.seq.gen > 0 {
			t.Fatal("a was not preempted in transfer")
		}
		step(t, s)
	}
	if a.seq.state != waiting || !a.seq.kvIn || a.seq.computed != 0 || b.seq.state != running {
		t.Fatalf("after the preemption a is %v (kvIn %v, computed %d), b %v: want a waiting for its KV again",
			a.seq.state, a.seq.kvIn, a.seq.computed, b.seq.state)
	}
	for i := 0; a.seq.state != done; i++ {
		if i > 10000 {
			t.Fatal("a never finished")
		}
		_, d, ok := schedule(s, s.scheduleLocked)
		if !ok {
			t.Fatal("engine idle with a unfinished")
		}
		s.mu.Lock()
		if a.seq.state == running && a.seq.gen == 0 && a.seq.computed != 79 {
			t.Errorf("a readmitted with %d tokens computed, want its KV received (79)", a.seq.computed)
		}
		s.mu.Unlock()
		complete(s, d)
	}
	got := drain(t, a)
	if want := gen(t, newTestSim(t, nil), areq()); got.text != want.text {
		t.Errorf("decoded %q, mixed run %q", got.text, want.text)
	}
}
