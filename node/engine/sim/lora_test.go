package sim

import (
	"context"
	"errors"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/node/engine"
)

// loraSim is a Sim with adapters a, b and c of testModel and slots slots, driven by hand.
func loraSim(t *testing.T, slots int) *Sim {
	t.Helper()
	return newTestSim(t, func(c *Config) {
		c.MaxLoRAs = slots
		c.LoRAModules = map[string]string{"a": "/lora/a", "b": "/lora/b", "c": "/lora/c"}
	})
}

// stepSim runs one step by hand and ends the finished streams; false if there was nothing to run.
func stepSim(s *Sim) (time.Duration, bool) {
	s.mu.Lock()
	d, ok := s.scheduleLocked()
	var ends []*seq
	if ok {
		ends = s.completeLocked(d)
	}
	s.mu.Unlock()
	for _, q := range ends {
		q.stream.end(io.EOF)
	}
	return d, ok
}

func submitTo(t *testing.T, s *Sim, model, tag string, maxTokens int) *Stream {
	t.Helper()
	p := prompt(tag, 64)
	st, err := s.submit(context.Background(), &engine.Request{Model: model, Prompt: p, MaxTokens: maxTokens, Seed: fullSeed(t, p, maxTokens)})
	if err != nil {
		t.Fatalf("submit %s: %v", model, err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// runAll steps until nothing is left to run.
func runAll(t *testing.T, s *Sim) {
	t.Helper()
	for i := 0; ; i++ {
		if _, ok := stepSim(s); !ok {
			return
		}
		if i > 10000 {
			t.Fatal("the engine never went idle")
		}
	}
}

func TestAdapterRequestRunsOnItsBaseModel(t *testing.T) {
	s := loraSim(t, 2)
	var adapters []engine.Model
	for _, m := range s.Models() {
		if m.Parent != "" {
			adapters = append(adapters, m)
		}
	}
	want := []engine.Model{
		{Name: "a", ContextTokens: 131072, Parent: testModel, Root: "/lora/a"},
		{Name: "b", ContextTokens: 131072, Parent: testModel, Root: "/lora/b"},
		{Name: "c", ContextTokens: 131072, Parent: testModel, Root: "/lora/c"},
	}
	if !slices.Equal(adapters, want) {
		t.Fatalf("adapters listed %+v, want %+v", adapters, want)
	}
	r := gen(t, s, &engine.Request{Model: "a", Prompt: prompt("x", 40), MaxTokens: 4})
	if r.last.Usage.PromptTokens != 40 {
		t.Errorf("usage %+v", r.last.Usage)
	}
	_, err := s.Generate(context.Background(), &engine.Request{Model: "z", Prompt: []byte("hi"), MaxTokens: 4})
	if !errors.Is(err, engine.ErrRejected) {
		t.Errorf("unknown adapter: err %v, want ErrRejected", err)
	}
}

// An adapter's requests reuse only that adapter's cached blocks: not the base model's, not
// another adapter's, as vLLM keys its prefix cache by adapter.
func TestPrefixCacheIsKeyedByAdapter(t *testing.T) {
	s := loraSim(t, 4)
	p := prompt("shared system prompt", 256)
	cached := func(model string) int {
		return gen(t, s, &engine.Request{Model: model, Prompt: p, MaxTokens: 2}).last.Usage.CachedTokens
	}
	steps := []struct {
		model string
		hit   bool
	}{{testModel, false}, {"a", false}, {"b", false}, {"a", true}, {testModel, true}, {"b", true}}
	for _, st := range steps {
		if got := cached(st.model); (got > 0) != st.hit {
			t.Errorf("%s: %d cached tokens, want hit %v", st.model, got, st.hit)
		}
	}
}

// With every slot held by running requests, a request for another adapter waits; a base
// model's request behind it runs; the first step to batch an adapter pays its load time.
func TestAdapterWaitsForASlotAndLoadsOnce(t *testing.T) {
	s := loraSim(t, 1)
	c := s.cfg
	submitTo(t, s, "a", "one", 3)
	submitTo(t, s, "b", "two", 3)
	submitTo(t, s, testModel, "three", 3)

	d, _ := stepSim(s)
	st := s.State().LoRA
	if !slices.Equal(st.Running, []string{"a"}) || !slices.Equal(st.Waiting, []string{"b"}) || !slices.Equal(st.Resident, []string{"a"}) {
		t.Fatalf("after the first step: %+v, want a running and resident, b waiting", st)
	}
	if s.State().Running != 2 {
		t.Errorf("%d running, want 2 (the base model's request is not held behind b)", s.State().Running)
	}
	if base := stepTime(c, 128, 128); d != base+c.LoRALoadTime+c.StepPerLoRA {
		t.Errorf("first step %v, want %v + load %v + one adapter %v", d, base, c.LoRALoadTime, c.StepPerLoRA)
	}
	d, _ = stepSim(s)
	if base := stepTime(c, 2, 130); d != base+c.StepPerLoRA {
		t.Errorf("second step %v, want %v + one adapter %v (no load)", d, base, c.StepPerLoRA)
	}
	runAll(t, s)
	st = s.State().LoRA
	if !slices.Equal(st.Resident, []string{"b"}) || len(st.Running)+len(st.Waiting) != 0 {
		t.Errorf("at the end: %+v, want b alone resident", st)
	}
	if n := s.AdapterLoads(); n != 2 {
		t.Errorf("%d loads, want 2", n)
	}
}

// A waiting request whose adapter cannot join the batch is left out of the queue State reports
// (it is ahead of no request that can run) and counted in LoRA.Blocked; once a slot frees,
// it counts again.
func TestStateLeavesOutAdapterBlockedRequests(t *testing.T) {
	s := loraSim(t, 1)
	submitTo(t, s, "a", "one", 50)
	stepSim(s) // a runs, holding the one slot
	submitTo(t, s, "b", "two", 3)
	st := s.State()
	if st.Waiting != 0 || st.LoRA.Blocked != 1 || !slices.Equal(st.LoRA.Waiting, []string{"b"}) {
		t.Fatalf("b behind a full batch: waiting %d, blocked %d, adapters waiting %v; want 0, 1, [b]", st.Waiting, st.LoRA.Blocked, st.LoRA.Waiting)
	}
	running := st.QueuedPrefillTokens // a's remaining prefill alone
	submitTo(t, s, "a", "three", 3)
	if st := s.State(); st.Waiting != 1 || st.LoRA.Blocked != 1 || st.QueuedPrefillTokens <= running {
		t.Errorf("a second request for a: waiting %d, blocked %d, queued %d; want 1, 1, more than %d", st.Waiting, st.LoRA.Blocked, st.QueuedPrefillTokens, running)
	}
	runAll(t, s)
	if st := s.State(); st.Waiting != 0 || st.LoRA.Blocked != 0 {
		t.Errorf("at the end: waiting %d, blocked %d", st.Waiting, st.LoRA.Blocked)
	}
}

// A full set of slots evicts the least recently batched adapter.
func TestAdapterEvictsLeastRecentlyUsed(t *testing.T) {
	s := loraSim(t, 2)
	for _, m := range []string{"a", "b", "a", "c"} {
		submitTo(t, s, m, "p-"+m, 2)
		runAll(t, s)
	}
	if st := s.State().LoRA; !slices.Equal(st.Resident, []string{"a", "c"}) {
		t.Errorf("resident %v, want [a c] (b least recently used)", st.Resident)
	}
	if n := s.AdapterLoads(); n != 3 {
		t.Errorf("%d loads, want 3 (a's second run reuses its slot)", n)
	}
}

func TestLoadAndUnloadAdapter(t *testing.T) {
	s := newTestSim(t, func(c *Config) { c.MaxLoRAs = 1 })
	ctx := context.Background()
	cases := []struct {
		name       string
		op         func() error
		want       error
		listed     []string
		residentIn []string
	}{
		{"load without path", func() error { return s.LoadAdapter(ctx, "x", "") }, ErrAdapterArgs, nil, nil},
		{"unload unknown", func() error { return s.UnloadAdapter("x") }, ErrAdapterNotFound, nil, nil},
		{"load", func() error { return s.LoadAdapter(ctx, "x", "/lora/x") }, nil, []string{"x"}, []string{"x"}},
		{"load again", func() error { return s.LoadAdapter(ctx, "x", "/lora/x") }, ErrAdapterExists, []string{"x"}, []string{"x"}},
		{"load a base model's name", func() error { return s.LoadAdapter(ctx, testModel, "/p") }, ErrAdapterExists, []string{"x"}, []string{"x"}},
		{"load a second, no free slot", func() error { return s.LoadAdapter(ctx, "y", "/lora/y") }, nil, []string{"x", "y"}, []string{"x"}},
		{"unload", func() error { return s.UnloadAdapter("x") }, nil, []string{"y"}, nil},
	}
	for _, tc := range cases {
		if err := tc.op(); !errors.Is(err, tc.want) {
			t.Fatalf("%s: err %v, want %v", tc.name, err, tc.want)
		}
		var listed []string
		for _, m := range s.Models() {
			if m.Parent == testModel {
				listed = append(listed, m.Name)
			}
		}
		if !slices.Equal(listed, tc.listed) || !slices.Equal(s.State().LoRA.Resident, tc.residentIn) {
			t.Fatalf("%s: listed %v resident %v, want %v and %v", tc.name, listed, s.State().LoRA.Resident, tc.listed, tc.residentIn)
		}
	}
	if _, err := s.Generate(ctx, &engine.Request{Model: "x", Prompt: []byte("hi"), MaxTokens: 2}); !errors.Is(err, engine.ErrRejected) {
		t.Errorf("request for an unloaded adapter: err %v, want ErrRejected", err)
	}
}

func TestLoadAdapterEndsWithItsContext(t *testing.T) {
	s := newTestSim(t, func(c *Config) { c.LoRALoadTime = time.Hour })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.LoadAdapter(ctx, "x", "/lora/x"); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	if len(s.Models()) != 1 {
		t.Errorf("models %v: a cancelled load loaded", s.Models())
	}
}

func TestLoRARequestsInfoMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := newTestSim(t, func(c *Config) {
		c.MaxLoRAs = 1
		c.LoRAModules = map[string]string{"a": "/lora/a", "b": "/lora/b"}
		c.Registerer = reg
	})
	submitTo(t, s, "a", "one", 3)
	submitTo(t, s, "b", "two", 3)
	stepSim(s)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	var value float64
	for _, mf := range mfs {
		if mf.GetName() != "vllm:lora_requests_info" {
			continue
		}
		m := mf.GetMetric()[0]
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		value = m.GetGauge().GetValue()
	}
	want := map[string]string{"max_lora": "1", "running_lora_adapters": "a", "waiting_lora_adapters": "b"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("label %s = %q, want %q (all %v)", k, got[k], v, got)
		}
	}
	if now := float64(time.Now().Unix()); value < now-60 || value > now+60 {
		t.Errorf("value %v, want the time of the reading", value)
	}
	if len(got) == 0 {
		t.Error("no vllm:lora_requests_info gathered")
	}
}
