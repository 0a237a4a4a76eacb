package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node/engine"
)

func TestDefaultConfigDerivesPool(t *testing.T) {
	s, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// (0.9 × 80 GiB − 16.06 GB) / (128 KiB × 16) = 29205.99
	if got := s.KVBlocks(); got != 29205 {
		t.Errorf("KVBlocks = %d, want 29205", got)
	}
	st := s.State()
	if st.KVBlocksTotal != 29205 || st.BlockTokens != 16 || st.MaxRunning != 256 || !st.Healthy {
		t.Errorf("State = %+v", st)
	}
	// 2048 / (5 ms + 2048 × 30.04 µs) at TimeScale 1.
	want := 2048 / (0.005 + 2048*30.04e-6)
	if d := st.PrefillTokensPerSecond - want; d > 1 || d < -1 {
		t.Errorf("PrefillTokensPerSecond = %v, want %v", st.PrefillTokensPerSecond, want)
	}
	if d := st.DecodeStepSeconds - 0.00503; d > 1e-9 || d < -1e-9 {
		t.Errorf("idle DecodeStepSeconds = %v, want 0.00503", st.DecodeStepSeconds)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
	}{
		{"no models", func(c *Config) { c.Models = []engine.Model{} }},
		{"duplicate model", func(c *Config) {
			c.Models = []engine.Model{{Name: "a", ContextTokens: 10}, {Name: "a", ContextTokens: 10}}
		}},
		{"model without context", func(c *Config) { c.Models = []engine.Model{{Name: "a"}} }},
		{"negative blocks", func(c *Config) { c.KVBlocks = -1 }},
		{"weights fill memory", func(c *Config) { c.WeightBytes = 80 << 30 }},
		{"utilisation over 1", func(c *Config) { c.GPUMemoryUtilization = 1.5 }},
		{"negative time scale", func(c *Config) { c.TimeScale = -1 }},
		{"negative coefficient", func(c *Config) { c.StepPerToken = -1 }},
		{"negative seqs", func(c *Config) { c.MaxNumSeqs = -3 }},
		{"unknown scheduling policy", func(c *Config) { c.SchedulingPolicy = "lifo" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tt.mod(&cfg)
			if _, err := New(cfg); !errors.Is(err, ErrConfig) {
				t.Fatalf("New = %v, want ErrConfig", err)
			}
		})
	}
}

// TestZeroConfigIsTheDefault pins the zero rule: a zero field takes its default, each step
// coefficient on its own.
func TestZeroConfigIsTheDefault(t *testing.T) {
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	d := DefaultConfig()
	if fmt.Sprintf("%+v", s.cfg) != fmt.Sprintf("%+v", d) {
		t.Errorf("New(Config{}) filled\n%+v\nwant\n%+v", s.cfg, d)
	}
	s2, err := New(Config{StepFixed: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s2.Close() })
	if s2.cfg.StepFixed != time.Millisecond || s2.cfg.StepPerToken != d.StepPerToken || s2.cfg.StepPerContextToken != d.StepPerContextToken {
		t.Errorf("one coefficient set: filled %v %v %v", s2.cfg.StepFixed, s2.cfg.StepPerToken, s2.cfg.StepPerContextToken)
	}
}

func TestPrefixReuse(t *testing.T) {
	var log prefixLog
	s := newTestSim(t, func(c *Config) { c.OnPrefix = log.on })
	p := prompt("reuse", 1024)
	req := &engine.Request{Model: testModel, Prompt: p, MaxTokens: 4, Seed: 1}
	first := gen(t, s, req)
	second := gen(t, s, req)

	if first.last.Usage.CachedTokens != 0 {
		t.Errorf("first CachedTokens = %d, want 0", first.last.Usage.CachedTokens)
	}
	// 64 full blocks cached; one block short so the last token is computed.
	if got := second.last.Usage.CachedTokens; got != 63*16 {
		t.Errorf("second CachedTokens = %d, want %d", got, 63*16)
	}
	c := s.cfg
	if want := stepTime(c, 1024, 1024); first.timing.TTFT != want {
		t.Errorf("first TTFT = %v, want one full prefill step %v", first.timing.TTFT, want)
	}
	if want := stepTime(c, 16, 1024); second.timing.TTFT != want {
		t.Errorf("second TTFT = %v, want one 16-token step %v", second.timing.TTFT, want)
	}
	if second.text != first.text {
		t.Errorf("same request, different text: %q vs %q", first.text, second.text)
	}
	stored, _ := log.snapshot()
	if want := kvindex.Blocks(testModel, p, 16); !slices.Equal(stored, want) {
		t.Errorf("OnPrefix stored %d blocks, want the prompt's %d blocks in order", len(stored), len(want))
	}
	res := s.ResidentBlocks()
	slices.Sort(res)
	want := kvindex.Blocks(testModel, p, 16)
	slices.Sort(want)
	if !slices.Equal(res, want) {
		t.Errorf("ResidentBlocks = %d blocks, want the prompt's %d", len(res), len(want))
	}
	st := s.State()
	if wantRate := float64(1008) / float64(2*1024); st.HitRate < wantRate-1e-9 || st.HitRate > wantRate+1e-9 {
		t.Errorf("HitRate = %v, want %v", st.HitRate, wantRate)
	}
	if st.KVBlocksUsed != 0 || s.CachedBlocks() != 64 {
		t.Errorf("idle: used %d cached %d, want 0 and 64", st.KVBlocksUsed, s.CachedBlocks())
	}
}

// TestPrefixReportsAnchorsByChainPosition pins that the anchors an engine reports and
// snapshots are those of the chains it stored, by each block's position in its chain, also
// when a request extends a prefix cached by an earlier one.
func TestPrefixReportsAnchorsByChainPosition(t *testing.T) {
	var log prefixLog
	s := newTestSim(t, func(c *Config) { c.KVBlocks = 512; c.OnPrefix = log.on })
	long := prompt("anchors", 200*16)
	gen(t, s, &engine.Request{Model: testModel, Prompt: long[:64*16*4], MaxTokens: 1})
	chain := kvindex.Blocks(testModel, long, 16)
	stored, _ := log.anchors()
	if want := kvindex.AppendAnchors(nil, chain[:64]); !slices.Equal(stored, want) {
		t.Fatalf("64-block prompt: stored anchors %x, want %x", stored, want)
	}
	gen(t, s, &engine.Request{Model: testModel, Prompt: long, MaxTokens: 1})
	stored, _ = log.anchors()
	if want := kvindex.AppendAnchors(nil, chain); !slices.Equal(stored, want) {
		t.Fatalf("after extending it to 200 blocks: stored anchors %x, want %x", stored, want)
	}
	res := s.ResidentAnchors()
	slices.Sort(res)
	want := kvindex.AppendAnchors(nil, chain)
	slices.Sort(want)
	if !slices.Equal(res, want) {
		t.Errorf("ResidentAnchors = %x, want the chain's %d anchors", res, len(want))
	}
}

func TestChunkedPrefillTTFT(t *testing.T) {
	s := newTestSim(t, func(c *Config) { c.MaxNumBatchedTokens = 64 })
	r := gen(t, s, &engine.Request{Model: testModel, Prompt: prompt("chunk", 256), MaxTokens: 1})
	c := s.cfg
	var want time.Duration
	for done := 64; done <= 256; done += 64 {
		want += stepTime(c, 64, done)
	}
	if r.timing.TTFT != want || r.timing.Queue != 0 {
		t.Errorf("timing = %+v, want TTFT %v (four 64-token chunks) and no queueing", r.timing, want)
	}
	if r.last.FinishReason != engine.FinishLength || r.last.Usage.CompletionTokens != 1 {
		t.Errorf("last = %+v", r.last)
	}
}

func TestEvictionLRU(t *testing.T) {
	var log prefixLog
	s := newTestSim(t, func(c *Config) { c.KVBlocks = 20; c.OnPrefix = log.on })
	ps := map[string][]byte{}
	for _, tag := range []string{"a", "b", "c", "d"} {
		ps[tag] = prompt("evict-"+tag, 96) // 6 full blocks each
		gen(t, s, &engine.Request{Model: testModel, Prompt: ps[tag], MaxTokens: 1})
	}
	// a, b, c fill 18 of 20 blocks; d needs 6, so 4 go, the least recently used prefix
	// (a's) from its tail.
	a := kvindex.Blocks(testModel, ps["a"], 16)
	_, evicted := log.snapshot()
	if want := []uint64{a[5], a[4], a[3], a[2]}; !slices.Equal(evicted, want) {
		t.Fatalf("evicted %x, want a's last four blocks tail first %x", evicted, want)
	}
	if _, anchors := log.anchors(); !slices.Equal(anchors, []uint64{a[3]}) {
		t.Fatalf("evicted anchors %x, want a's block 3 alone %x", anchors, a[3])
	}
	if n := s.CachedBlocks(); n != 20 {
		t.Errorf("CachedBlocks = %d, want 20", n)
	}
	// a's head survives: a repeat reuses its first two blocks.
	r := gen(t, s, &engine.Request{Model: testModel, Prompt: ps["a"], MaxTokens: 1})
	if r.last.Usage.CachedTokens != 32 {
		t.Errorf("CachedTokens after eviction = %d, want 32", r.last.Usage.CachedTokens)
	}
}

func TestDemoteEvictsFirst(t *testing.T) {
	var log prefixLog
	s := newTestSim(t, func(c *Config) { c.KVBlocks = 20; c.OnPrefix = log.on })
	ps := map[string][]byte{}
	for _, tag := range []string{"a", "b", "c", "d"} {
		ps[tag] = prompt("demote-"+tag, 96)
	}
	for _, tag := range []string{"a", "b", "c"} {
		gen(t, s, &engine.Request{Model: testModel, Prompt: ps[tag], MaxTokens: 1})
	}
	c := kvindex.Blocks(testModel, ps["c"], 16)
	if n := s.Demote(append(slices.Clone(c), 42)); n != 6 {
		t.Fatalf("Demote = %d, want c's 6 cached blocks (42 is not cached)", n)
	}
	// c was used last, but demoted it goes first, its tail first; a, the least recently
	// used, stays.
	gen(t, s, &engine.Request{Model: testModel, Prompt: ps["d"], MaxTokens: 1})
	_, evicted := log.snapshot()
	if want := []uint64{c[5], c[4], c[3], c[2]}; !slices.Equal(evicted, want) {
		t.Fatalf("evicted %x, want c's tail %x", evicted, want)
	}
	res := s.ResidentBlocks()
	for _, h := range kvindex.Blocks(testModel, ps["a"], 16) {
		if !slices.Contains(res, h) {
			t.Errorf("a's block %x evicted before the demoted ones", h)
		}
	}
}

func TestPreemption(t *testing.T) {
	const maxTok = 64
	reg := prometheus.NewRegistry()
	// Four sequences each end at 96 tokens = 6 blocks; 24 > 16 forces preemption once any three
	// run together. In real time (a step is over 5 ms) the four submissions below land within
	// the first steps; at the helpers' 10,000× one sequence could finish before the next
	// arrived on a loaded machine, and nothing was preempted.
	s := newTestSim(t, func(c *Config) { c.KVBlocks = 16; c.Registerer = reg; c.TimeScale = 1 })
	ref := newTestSim(t, func(c *Config) { c.KVBlocks = 1024 })
	var reqs []*engine.Request
	for _, tag := range []string{"p0", "p1", "p2", "p3"} {
		p := prompt(tag, 32)
		reqs = append(reqs, &engine.Request{Model: testModel, Prompt: p, MaxTokens: maxTok, Seed: fullSeed(t, p, maxTok)})
	}
	var streams []engine.Stream
	for _, r := range reqs {
		st, err := s.Generate(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		streams = append(streams, st)
	}
	for i, st := range streams {
		got := drain(t, st)
		want := gen(t, ref, reqs[i])
		if got.text != want.text || got.last.Usage.CompletionTokens != maxTok || got.last.FinishReason != engine.FinishLength {
			t.Errorf("request %d after preemption: %d tokens %q, want %q", i, got.last.Usage.CompletionTokens, got.text, want.text)
		}
	}
	if got := counterValue(t, reg, "vllm:num_preemptions_total"); got < 1 {
		t.Errorf("vllm:num_preemptions_total = %v, want ≥ 1", got)
	}
	if st := s.State(); st.Running != 0 || st.Waiting != 0 || st.KVBlocksUsed != 0 {
		t.Errorf("after all finished: %+v", st)
	}
}

func TestFinish(t *testing.T) {
	p := prompt("finish", 40)
	full := fullSeed(t, p, 20)
	s := newTestSim(t, nil)
	ref := gen(t, s, &engine.Request{Model: testModel, Prompt: p, MaxTokens: 20, Seed: full}).text
	if len(ref) != 80 {
		t.Fatalf("20 tokens gave %d bytes, want 80", len(ref))
	}
	var short uint64
	for short = 0; naturalLength(textSeed(short, p), 20) >= 20; short++ {
	}
	shortLen := naturalLength(textSeed(short, p), 20)
	spanning := ref[6:11] // crosses the token boundary at byte 8
	tests := []struct {
		name       string
		req        engine.Request
		wantText   string
		wantReason string
		wantTokens int
	}{
		{"max tokens", engine.Request{MaxTokens: 5, Seed: full}, ref[:20], engine.FinishLength, 5},
		{"stop spanning tokens", engine.Request{MaxTokens: 20, Seed: full, Stop: []string{"zzz", spanning}},
			ref[:strings.Index(ref, spanning)], engine.FinishStop, -1},
		{"stop never seen", engine.Request{MaxTokens: 20, Seed: full, Stop: []string{"xyzzy"}}, ref, engine.FinishLength, 20},
		{"natural end", engine.Request{MaxTokens: 20, Seed: short}, "", engine.FinishStop, shortLen},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := tt.req
			req.Model, req.Prompt = testModel, p
			r := gen(t, s, &req)
			if tt.wantText != "" && r.text != tt.wantText {
				t.Errorf("text = %q, want %q", r.text, tt.wantText)
			}
			if r.last.FinishReason != tt.wantReason {
				t.Errorf("finish = %q, want %q", r.last.FinishReason, tt.wantReason)
			}
			if tt.wantTokens >= 0 && r.last.Usage.CompletionTokens != tt.wantTokens {
				t.Errorf("CompletionTokens = %d, want %d", r.last.Usage.CompletionTokens, tt.wantTokens)
			}
			if tt.wantTokens >= 0 && len(r.text) != 4*tt.wantTokens && len(req.Stop) == 0 {
				t.Errorf("text is %d bytes, want 4 per token", len(r.text))
			}
			if r.last.Usage.PromptTokens != 40 {
				t.Errorf("PromptTokens = %d, want 40", r.last.Usage.PromptTokens)
			}
		})
	}
}

func TestDeterministicText(t *testing.T) {
	s := newTestSim(t, nil)
	p := prompt("det", 20)
	seed := fullSeed(t, p, 30)
	a := gen(t, s, &engine.Request{Model: testModel, Prompt: p, MaxTokens: 30, Seed: seed})
	b := gen(t, s, &engine.Request{Model: testModel, Prompt: p, MaxTokens: 30, Seed: seed})
	other := seed + 1
	for naturalLength(textSeed(other, p), 30) != 30 {
		other++
	}
	c := gen(t, s, &engine.Request{Model: testModel, Prompt: p, MaxTokens: 30, Seed: other})
	if a.text != b.text {
		t.Errorf("same seed, different text:\n%q\n%q", a.text, b.text)
	}
	if a.text == c.text {
		t.Errorf("different seeds, same text %q", a.text)
	}
}

func TestNaturalLengthShare(t *testing.T) {
	full := 0
	const n = 10000
	for i := uint64(0); i < n; i++ {
		l := naturalLength(splitmix64(i), 100)
		if l < 1 || l > 100 {
			t.Fatalf("natural length %d outside 1..100", l)
		}
		if l == 100 {
			full++
		}
	}
	// 70% by rule, plus 1% of the other 30% drawing exactly 100.
	if share := float64(full) / n; share < 0.68 || share > 0.73 {
		t.Errorf("share running to max_tokens = %v, want ≈ 0.70", share)
	}
}

func TestCancel(t *testing.T) {
	tests := []struct {
		name   string
		cancel func(context.CancelFunc, engine.Stream)
	}{
		{"context", func(cancel context.CancelFunc, _ engine.Stream) { cancel() }},
		{"stream close", func(_ context.CancelFunc, st engine.Stream) { st.Close() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestSim(t, func(c *Config) { c.KVBlocks = 8000 })
			p := prompt("cancel-"+tt.name, 100)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			st, err := s.Generate(ctx, &engine.Request{Model: testModel, Prompt: p, MaxTokens: 100000, Seed: fullSeed(t, p, 100000)})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if _, err := st.Recv(); err != nil {
				t.Fatalf("first Recv: %v", err)
			}
			if got := s.State().Running; got != 1 {
				t.Fatalf("Running = %d, want 1", got)
			}
			tt.cancel(cancel, st)
			poll.Until(t, 10*time.Second, "Running to drop to 0", func() bool { st := s.State(); return st.Running == 0 && st.KVBlocksUsed == 0 })
			// Drain what was buffered; the stream must end in an error, not io.EOF.
			for {
				_, err = st.Recv()
				if err != nil {
					break
				}
			}
			if !errors.Is(err, context.Canceled) && !errors.Is(err, ErrStreamClosed) {
				t.Errorf("Recv after cancel = %v, want context.Canceled or ErrStreamClosed", err)
			}
			if s.CachedBlocks() != 6 {
				t.Errorf("CachedBlocks = %d, want the prompt's 6 blocks still cached", s.CachedBlocks())
			}
		})
	}
}

func TestGenerateRejects(t *testing.T) {
	s := newTestSim(t, func(c *Config) {
		c.KVBlocks = 8
		c.Models = []engine.Model{{Name: testModel, ContextTokens: 1000}}
	})
	tests := []struct {
		name string
		req  engine.Request
	}{
		{"oversize for pool", engine.Request{Model: testModel, Prompt: prompt("x", 100), MaxTokens: 100}},
		{"over context", engine.Request{Model: testModel, Prompt: prompt("x", 10), MaxTokens: 1000}},
		{"unknown model", engine.Request{Model: "nope", Prompt: prompt("x", 10), MaxTokens: 10}},
		{"zero max tokens", engine.Request{Model: testModel, Prompt: prompt("x", 10), MaxTokens: 0}},
		{"resuming over context", engine.Request{Model: testModel, Prompt: prompt("x", 10), MaxTokens: 10,
			Resume: &engine.Resume{Tokens: 991, Bytes: 4}}},
		{"resuming negative bytes", engine.Request{Model: testModel, Prompt: prompt("x", 10), MaxTokens: 10,
			Resume: &engine.Resume{Tokens: 1, Bytes: -1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := s.Generate(context.Background(), &tt.req); !errors.Is(err, engine.ErrRejected) {
				t.Errorf("Generate = %v, want ErrRejected", err)
			}
		})
	}
	// Exactly the pool fits: 8 blocks × 16 tokens.
	r := gen(t, s, &engine.Request{Model: testModel, Prompt: prompt("fit", 64), MaxTokens: 64, Seed: 3})
	if r.last.Usage.CompletionTokens < 1 {
		t.Errorf("fitting request produced %+v", r.last)
	}
}

func TestCloseFailsInFlight(t *testing.T) {
	s := newTestSim(t, func(c *Config) { c.KVBlocks = 8000; c.MaxNumSeqs = 1 })
	p := prompt("close", 50)
	st, err := s.Generate(context.Background(), &engine.Request{Model: testModel, Prompt: p, MaxTokens: 100000, Seed: fullSeed(t, p, 100000)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	// MaxNumSeqs 1 keeps this one waiting behind the first.
	queued, err := s.Generate(context.Background(), &engine.Request{Model: testModel, Prompt: prompt("close-2", 50), MaxTokens: 10})
	if err != nil {
		t.Fatal(err)
	}
	if w := s.State().Waiting; w != 1 {
		t.Fatalf("Waiting = %d, want 1", w)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	for {
		_, err = st.Recv()
		if err != nil {
			break
		}
	}
	if !errors.Is(err, ErrClosed) || !errors.Is(err, engine.ErrUnavailable) {
		t.Errorf("Recv after Close = %v, want ErrClosed wrapping engine.ErrUnavailable", err)
	}
	if _, err := queued.Recv(); !errors.Is(err, ErrClosed) {
		t.Errorf("waiting stream Recv after Close = %v, want ErrClosed", err)
	}
	if _, err := s.Generate(context.Background(), &engine.Request{Model: testModel, Prompt: p, MaxTokens: 1}); !errors.Is(err, ErrClosed) {
		t.Errorf("Generate after Close = %v, want ErrClosed", err)
	}
	if st := s.State(); st.Healthy || st.Running != 0 {
		t.Errorf("State after Close = %+v", st)
	}
}

func TestSlowReaderDoesNotStall(t *testing.T) {
	s := newTestSim(t, nil)
	p := prompt("slow", 16)
	slow, err := s.Generate(context.Background(), &engine.Request{Model: testModel, Prompt: p, MaxTokens: 200, Seed: fullSeed(t, p, 200)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { slow.Close() })
	// The fast request is queued after the slow one and needs more steps than the slow one
	// has tokens: it can only finish if the loop runs on while nobody reads the slow stream.
	fast := gen(t, s, &engine.Request{Model: testModel, Prompt: prompt("fast", 16), MaxTokens: 300, Seed: fullSeed(t, prompt("fast", 16), 300)})
	if fast.last.Usage.CompletionTokens != 300 {
		t.Fatalf("fast = %+v", fast.last)
	}
	r := drain(t, slow)
	if r.last.Usage.CompletionTokens != 200 || len(r.text) != 800 {
		t.Errorf("slow stream lost output: %d tokens, %d bytes", r.last.Usage.CompletionTokens, len(r.text))
	}
}

func TestStateQueued(t *testing.T) {
	s2 := newTestSim(t, func(c *Config) { c.KVBlocks = 100 })
	// submit without starting the loop.
	for i, tag := range []string{"q1", "q2"} {
		if _, err := s2.submit(context.Background(), &engine.Request{Model: testModel, Prompt: prompt(tag, 100+i), MaxTokens: 5}); err != nil {
			t.Fatal(err)
		}
	}
	st := s2.State()
	if st.Waiting != 2 || st.Running != 0 || st.QueuedPrefillTokens != 201 {
		t.Errorf("State = %+v, want 2 waiting and 201 queued prefill tokens", st)
	}
	// One scheduled step moves them into the batch; nothing is prefilled until it completes.
	s2.mu.Lock()
	d, ok := s2.scheduleLocked()
	s2.mu.Unlock()
	if !ok || d != stepTime(s2.cfg, 201, 201) {
		t.Errorf("step = %v %v, want %v", d, ok, stepTime(s2.cfg, 201, 201))
	}
	if st := s2.State(); st.Running != 2 || st.Waiting != 0 || st.KVBlocksUsed != 14 {
		t.Errorf("after schedule: %+v, want 2 running holding 14 blocks", st)
	}
	s2.mu.Lock()
	s2.completeLocked(d)
	s2.mu.Unlock()
	if st := s2.State(); st.QueuedPrefillTokens != 0 {
		t.Errorf("after the prefill step: QueuedPrefillTokens = %d, want 0", st.QueuedPrefillTokens)
	}
	if s2.SimTime() != d {
		t.Errorf("SimTime = %v, want %v", s2.SimTime(), d)
	}
}

func TestMetricFamilies(t *testing.T) {
	regA, regB := prometheus.NewRegistry(), prometheus.NewRegistry()
	a := newTestSim(t, func(c *Config) { c.Registerer = regA })
	newTestSim(t, func(c *Config) { c.Registerer = regB }) // a second Sim on its own registry
	gen(t, a, &engine.Request{Model: testModel, Prompt: prompt("m", 64), MaxTokens: 3, Seed: fullSeed(t, prompt("m", 64), 3)})
	mfs, err := regA.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		got[mf.GetName()] = true
		if mf.GetName() == "vllm:cache_config_info" {
			l := mf.GetMetric()[0].GetLabel()
			if len(l) != 2 || l[0].GetValue() != "16" || l[1].GetValue() != "256" {
				t.Errorf("cache_config_info labels = %v", l)
			}
		}
	}
	for _, name := range []string{
		"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
		"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
		"vllm:generation_tokens_total", "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
		"vllm:request_queue_time_seconds", "vllm:num_preemptions_total", "vllm:cache_config_info",
	} {
		if !got[name] {
			t.Errorf("metric family %s missing", name)
		}
	}
	if v := counterValue(t, regA, "vllm:generation_tokens_total"); v != 3 {
		t.Errorf("generation_tokens_total = %v, want 3", v)
	}
	if v := counterValue(t, regA, "vllm:prompt_tokens_total"); v != 64 {
		t.Errorf("prompt_tokens_total = %v, want 64", v)
	}
	if v := counterValue(t, regB, "vllm:generation_tokens_total"); v != 0 {
		t.Errorf("other Sim's generation_tokens_total = %v, want 0", v)
	}
}

func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

func TestCloseUnregistersMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := DefaultConfig()
	cfg.KVBlocks, cfg.Registerer = 64, reg
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(cfg); err == nil {
		t.Fatal("second Sim registered the same metric names on one registry")
	}
	a.Close()
	b, err := New(cfg)
	if err != nil {
		t.Fatalf("New after Close on the same registry: %v", err)
	}
	b.Close()
}

func TestConcurrentSamePrefixSharesBlocks(t *testing.T) {
	s := newTestSim(t, func(c *Config) { c.KVBlocks = 64 })
	p := prompt("twins", 160) // 10 full blocks
	var streams []*Stream
	for range 2 {
		st, err := s.submit(context.Background(), &engine.Request{Model: testModel, Prompt: p, MaxTokens: 8, Seed: fullSeed(t, p, 8)})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	// Both are admitted in the same step, before either has stored its blocks: each computes
	// the prompt privately, and the second store finds the blocks already cached.
	s.mu.Lock()
	d, _ := s.scheduleLocked()
	s.completeLocked(d)
	stored := len(s.delta.Stored)
	s.mu.Unlock()
	if stored != 10 {
		t.Errorf("step stored %d new blocks, want 10 (the duplicate store adds none)", stored)
	}
	if st := s.State(); st.Running != 2 || st.KVBlocksUsed != 10 || s.CachedBlocks() != 10 {
		t.Fatalf("after shared prefill: %+v cached %d, want 2 running sharing 10 blocks (the prompt fills them exactly)", st, s.CachedBlocks())
	}
	s.Start()
	for _, st := range streams {
		r := drain(t, st)
		if r.last.Usage.CompletionTokens != 8 || r.last.Usage.CachedTokens != 0 {
			t.Errorf("usage = %+v", r.last.Usage)
		}
	}
	poll.Until(t, 10*time.Second, "both to leave the batch", func() bool { st := s.State(); return st.Running+st.Waiting == 0 })
	if st := s.State(); st.KVBlocksUsed != 0 || s.CachedBlocks() != 10 {
		t.Errorf("after finish: used %d, cached %d; want 0, 10", st.KVBlocksUsed, s.CachedBlocks())
	}
}

// TestPace pins down the step loop's schedule: a step ends its duration after the previous
// step was due, so CPU time spent between steps is made up, not added to the modelled GPU's
// time, except after an idle engine or a stall longer than maxLag.
func TestPace(t *testing.T) {
	t0 := time.Unix(1000, 0)
	d := 10 * time.Millisecond
	tests := []struct {
		name      string
		prev, now time.Time
		want      time.Time
	}{
		{"idle engine starts now", time.Time{}, t0, t0.Add(d)},
		{"on time", t0, t0, t0.Add(d)},
		{"woken late: the lag is made up", t0, t0.Add(3 * time.Millisecond), t0.Add(d)},
		{"late by more than the step: due at once", t0, t0.Add(20 * time.Millisecond), t0.Add(d)},
		{"stall past maxLag is forgotten", t0, t0.Add(maxLag + time.Millisecond), t0.Add(maxLag + time.Millisecond + d)},
		{"early wake-up keeps the schedule", t0, t0.Add(-time.Millisecond), t0.Add(d)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := pace(tt.prev, tt.now, d); !got.Equal(tt.want) {
				t.Errorf("pace = %v after t0, want %v", got.Sub(t0), tt.want.Sub(t0))
			}
		})
	}
}

// TestResetPrefixCache: a reset drops every cached block and returns them, so the same prompt
// hits nothing after it; while a request runs it refuses, as vLLM's does, and drops nothing.
func TestResetPrefixCache(t *testing.T) {
	s := newTestSim(t, func(c *Config) { c.TimeScale = 1 }) // the long request runs for a minute
	p := prompt("reset", 64)
	gen(t, s, &engine.Request{Model: testModel, Prompt: p, MaxTokens: 1})
	before := s.ResidentBlocks()
	if len(before) != 4 {
		t.Fatalf("%d blocks cached, want the prompt's 4", len(before))
	}

	st, err := s.Generate(context.Background(), &engine.Request{Model: testModel, Prompt: prompt("long", 32), MaxTokens: 3000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.ResetPrefixCache(); !errors.Is(err, ErrCacheInUse) {
		t.Errorf("reset while a request runs: err %v, want ErrCacheInUse", err)
	}
	st.Close()
	poll.Until(t, 5*time.Second, "the closed request to leave", func() bool { st := s.State(); return st.Running+st.Waiting == 0 })

	held, err := s.ResetPrefixCache()
	if err != nil {
		t.Fatal(err)
	}
	if len(held) < 4 || s.CachedBlocks() != 0 {
		t.Errorf("reset returned %d blocks and left %d cached", len(held), s.CachedBlocks())
	}
	for _, h := range before {
		if !slices.Contains(held, h) {
			t.Errorf("block %x was cached and is not among those reset", h)
		}
	}
	if r := gen(t, s, &engine.Request{Model: testModel, Prompt: p, MaxTokens: 1}); r.last.Usage.CachedTokens != 0 {
		t.Errorf("the prompt again hit %d cached tokens after the reset", r.last.Usage.CachedTokens)
	}
}
