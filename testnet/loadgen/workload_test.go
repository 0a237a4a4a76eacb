package loadgen

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

func planCfg(workload string, rate float64, d time.Duration, seed int64) Config {
	cfg := DefaultConfig()
	cfg.Targets = []string{"http://127.0.0.1:1"}
	cfg.Workload, cfg.Rate, cfg.Duration, cfg.Seed = workload, rate, d, seed
	return cfg
}

func mustPlan(t *testing.T, cfg Config) []Item {
	t.Helper()
	items, err := Plan(cfg)
	if err != nil {
		t.Fatalf("Plan: %v", err)
	}
	return items
}

func TestPlanDeterministicUnderSeed(t *testing.T) {
	for _, w := range Workloads() {
		t.Run(w, func(t *testing.T) {
			a := mustPlan(t, planCfg(w, 20, 20*time.Second, 7))
			b := mustPlan(t, planCfg(w, 20, 20*time.Second, 7))
			c := mustPlan(t, planCfg(w, 20, 20*time.Second, 8))
			if len(a) == 0 {
				t.Fatal("empty plan")
			}
			if !reflect.DeepEqual(a, b) {
				t.Fatal("same seed gave different plans")
			}
			for i := range a {
				if !reflect.DeepEqual(a[i].Messages(), b[i].Messages()) {
					t.Fatalf("item %d: same seed gave different prompts", i)
				}
			}
			if reflect.DeepEqual(a, c) {
				t.Fatal("different seeds gave the same plan")
			}
		})
	}
}

func TestPoissonArrivals(t *testing.T) {
	const rate = 50.0
	items := mustPlan(t, planCfg("chat", rate, 400*time.Second, 3))
	n := float64(len(items))
	if want := rate * 400; math.Abs(n-want) > 4*math.Sqrt(want) {
		t.Fatalf("got %v arrivals, want %v ± 4σ", n, want)
	}
	var sum, sq float64
	prev := time.Duration(0)
	for _, it := range items {
		gap := (it.At - prev).Seconds()
		if gap < 0 {
			t.Fatal("arrivals not sorted")
		}
		sum += gap
		sq += gap * gap
		prev = it.At
	}
	mean := sum / n
	cv := math.Sqrt(sq/n-mean*mean) / mean
	if math.Abs(mean-1/rate) > 0.03/rate {
		t.Errorf("mean gap %v, want %v", mean, 1/rate)
	}
	// Exponential gaps have a coefficient of variation of 1.
	if math.Abs(cv-1) > 0.05 {
		t.Errorf("gap coefficient of variation %v, want 1", cv)
	}
}

// TestBurstyOnOff pins the burst shape at the default period and at a stretched one (a bench
// on an engine running at half speed doubles it).
func TestBurstyOnOff(t *testing.T) {
	const rate = 20.0
	d := 800 * time.Second
	for _, period := range []time.Duration{0, 2 * DefaultBurstPeriod} {
		cfg := planCfg("bursty", rate, d, 5)
		cfg.BurstPeriod = period
		if period == 0 {
			period = DefaultBurstPeriod
		}
		t.Run(period.String(), func(t *testing.T) {
			items := mustPlan(t, cfg)
			var on, off int
			for _, it := range items {
				if it.At%period < time.Duration(BurstOnFraction*float64(period)) {
					on++
				} else {
					off++
				}
			}
			onSecs := d.Seconds() * BurstOnFraction
			offSecs := d.Seconds() - onSecs
			onRate, offRate := float64(on)/onSecs, float64(off)/offSecs
			if math.Abs(onRate-BurstHigh*rate) > 0.05*BurstHigh*rate {
				t.Errorf("on-period rate %v, want %v", onRate, BurstHigh*rate)
			}
			if math.Abs(offRate-BurstLow*rate) > 0.1*BurstLow*rate {
				t.Errorf("off-period rate %v, want %v", offRate, BurstLow*rate)
			}
			if mean := float64(len(items)) / d.Seconds(); math.Abs(mean-rate) > 0.05*rate {
				t.Errorf("mean rate %v, want %v", mean, rate)
			}
		})
	}
}

func TestMixedCostsSpanThreeOrders(t *testing.T) {
	items := mustPlan(t, planCfg("mixed", 100, 200*time.Second, 11))
	count := map[string]int{}
	minTok, maxTok := map[string]int{}, map[string]int{}
	classes := map[string]map[string]int{}
	for _, it := range items {
		k := it.Kind
		count[k]++
		if minTok[k] == 0 || it.PromptTokens < minTok[k] {
			minTok[k] = it.PromptTokens
		}
		maxTok[k] = max(maxTok[k], it.PromptTokens)
		if classes[k] == nil {
			classes[k] = map[string]int{}
		}
		classes[k][it.Class.Name]++
	}
	n := float64(len(items))
	for _, c := range []struct {
		kind     string
		frac     float64
		lo, hi   int
		interact float64
	}{
		{KindChat, 0.80, 60, 140, 0.8},
		{KindRAG, 0.19, 3700, 4100, 0.5},
		{KindRepo, 0.01, 98200, 100000, 0},
	} {
		got := float64(count[c.kind]) / n
		if math.Abs(got-c.frac) > 0.15*c.frac+0.002 {
			t.Errorf("%s: fraction %v, want %v", c.kind, got, c.frac)
		}
		if minTok[c.kind] < c.lo || maxTok[c.kind] > c.hi {
			t.Errorf("%s: prompt tokens %d..%d, want within %d..%d", c.kind, minTok[c.kind], maxTok[c.kind], c.lo, c.hi)
		}
		if f := float64(classes[c.kind]["interactive"]) / float64(count[c.kind]); math.Abs(f-c.interact) > 0.05 {
			t.Errorf("%s: interactive fraction %v, want %v", c.kind, f, c.interact)
		}
	}
	if r := float64(minTok[KindRepo]) / float64(maxTok[KindChat]); r < 500 {
		t.Errorf("repo/chat cost ratio %v, want three orders of magnitude", r)
	}
}

func TestPromptTextMatchesTokens(t *testing.T) {
	items := mustPlan(t, planCfg("mixed", 50, 10*time.Second, 2))
	docs := map[string]int{}
	for _, it := range items[:200] {
		msgs := it.Messages()
		total := 0
		for _, m := range msgs {
			total += len(m.Content)
		}
		if total != it.PromptTokens*bytesPerToken {
			t.Fatalf("%s: %d bytes for %d tokens", it.Kind, total, it.PromptTokens)
		}
		if it.Kind == KindRAG {
			if msgs[0].Role != "system" || len(msgs[0].Content) != ragDocTokens*bytesPerToken {
				t.Fatalf("rag prompt does not start with a document: %q", msgs[0].Role)
			}
			docs[msgs[0].Content]++
		}
	}
	shared := 0
	for _, n := range docs {
		if n > 1 {
			shared += n
		}
	}
	if len(docs) == 0 || len(docs) > ragDocs || shared == 0 {
		t.Fatalf("rag documents: %d distinct, %d requests on a shared one", len(docs), shared)
	}
}

func TestTextDeterministicPrefixes(t *testing.T) {
	a := Text(42, 1000)
	if len(a) != 1000 || Text(42, 1000) != a {
		t.Fatal("Text is not deterministic or not of the asked length")
	}
	if !strings.HasPrefix(Text(42, 5000), a) {
		t.Fatal("longer text of the same key does not extend the shorter")
	}
	if Text(43, 1000) == a {
		t.Fatal("different keys gave the same text")
	}
	for _, c := range []byte(a) {
		if c < ' ' || c > '~' {
			t.Fatalf("non-ASCII byte %q", c)
		}
	}
}

func TestAgentPlans(t *testing.T) {
	cfg := planCfg("agents", 11, 100*time.Second, 4)
	cfg.ToolWait = 200 * time.Millisecond
	items := mustPlan(t, cfg)
	steps, waits, nw := 0, time.Duration(0), 0
	ids := map[string]bool{}
	var sys string
	for _, it := range items {
		a := it.Agent
		if a == nil || it.Kind != KindAgent {
			t.Fatal("agents workload planned a non-agent item")
		}
		if a.Steps < 3 || a.Steps > 8 || len(a.ToolWaits) != a.Steps-1 {
			t.Fatalf("session %s: %d steps, %d waits", a.ID, a.Steps, len(a.ToolWaits))
		}
		if ids[a.ID] {
			t.Fatalf("duplicate session id %s", a.ID)
		}
		ids[a.ID] = true
		steps += a.Steps
		for i, w := range a.ToolWaits {
			waits += w
			nw++
			if a.ToolResult(i) == "" {
				t.Fatal("empty tool result")
			}
		}
		// All sessions share the agent system prompt, so their first blocks are cacheable.
		m := it.Messages()
		if sys == "" {
			sys = m[0].Content
		} else if m[0].Content != sys {
			t.Fatal("agent sessions do not share their system prompt")
		}
	}
	// The session rate is scaled so steps arrive at Rate on average.
	if r := float64(steps) / 100; math.Abs(r-11) > 2 {
		t.Errorf("agent steps per second %v, want about 11", r)
	}
	if mean := waits / time.Duration(nw); mean < 150*time.Millisecond || mean > 250*time.Millisecond {
		t.Errorf("mean tool wait %v, want about 200ms", mean)
	}
	// ToolScale multiplies every tool result's size and changes nothing else.
	cfg.ToolScale = 8
	scaled := mustPlan(t, cfg)
	if len(scaled) != len(items) {
		t.Fatalf("tool scale changed the plan: %d sessions, want %d", len(scaled), len(items))
	}
	for i := range items {
		a, b := items[i].Agent, scaled[i].Agent
		if a.Steps != b.Steps || a.ToolWaits[0] != b.ToolWaits[0] {
			t.Fatalf("session %d: tool scale changed steps or waits", i)
		}
		if la, lb := len(a.ToolResult(0)), len(b.ToolResult(0)); lb < 7*la || lb > 9*la {
			t.Fatalf("session %d: tool result %d bytes at scale 8, %d at 1", i, lb, la)
		}
	}
}

func TestPlanLimits(t *testing.T) {
	cfg := planCfg("chat", 1000, 0, 1)
	cfg.MaxRequests = 37
	if n := len(mustPlan(t, cfg)); n != 37 {
		t.Fatalf("MaxRequests 37 planned %d", n)
	}
	cfg = planCfg("chat", 1000, 50*time.Millisecond, 1)
	for _, it := range mustPlan(t, cfg) {
		if it.At >= 50*time.Millisecond {
			t.Fatalf("arrival %v past the duration", it.At)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	ok := planCfg("chat", 1, time.Second, 1)
	for _, c := range []struct {
		name string
		mut  func(*Config)
		want error
	}{
		{"no targets", func(c *Config) { c.Targets = nil }, ErrConfig},
		{"bad target", func(c *Config) { c.Targets = []string{"127.0.0.1:80"} }, ErrConfig},
		{"no model", func(c *Config) { c.Model = "" }, ErrConfig},
		{"zero rate", func(c *Config) { c.Rate = 0 }, ErrConfig},
		{"no horizon", func(c *Config) { c.Duration = 0 }, ErrConfig},
		{"scale above one", func(c *Config) { c.Scale = 2 }, ErrConfig},
		{"NaN rate", func(c *Config) { c.Rate = math.NaN() }, ErrConfig},
		{"infinite rate", func(c *Config) { c.Rate = math.Inf(1) }, ErrConfig},
		{"negative speedup", func(c *Config) { c.Speedup = -1 }, ErrConfig},
		{"NaN scale", func(c *Config) { c.Scale = math.NaN() }, ErrConfig},
		{"trace with speedup 0", func(c *Config) { c.Trace, c.Speedup = mooncakeTrace, 0 }, ErrConfig},
		{"trace with scale 0", func(c *Config) { c.Trace, c.Scale = mooncakeTrace, 0 }, ErrConfig},
		{"trace with NaN speedup", func(c *Config) { c.Trace, c.Speedup = mooncakeTrace, math.NaN() }, ErrConfig},
		{"trace with infinite speedup", func(c *Config) { c.Trace, c.Speedup = mooncakeTrace, math.Inf(1) }, ErrConfig},
		{"unknown workload", func(c *Config) { c.Workload = "nope" }, ErrUnknownWorkload},
		{"same class names", func(c *Config) { c.Batch.Name = c.Interactive.Name }, ErrConfig},
		{"negative tenants", func(c *Config) { c.SharedPrefix.Tenants = -1 }, ErrConfig},
		{"negative system prompt", func(c *Config) { c.SharedPrefix.SystemTokens = -1 }, ErrConfig},
		{"NaN tenant zipf", func(c *Config) { c.SharedPrefix.TenantZipf = math.NaN() }, ErrConfig},
		{"every request a follow-up", func(c *Config) { c.SharedPrefix.FollowUps = 1 }, ErrConfig},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := ok
			c.mut(&cfg)
			if _, err := Plan(cfg); !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
		})
	}
	if _, err := Plan(ok); err != nil {
		t.Fatalf("valid config: %v", err)
	}
}

// TestConversationKeys pins Item.Conversation on the synthetic workloads: a shared-prefix
// tenant's requests, follow-ups included, share one key; requests on one RAG document share
// one; agents' sessions, which all carry one system prompt, each have their own.
func TestConversationKeys(t *testing.T) {
	tenants := map[int]uint64{}
	for _, it := range mustPlan(t, sharedCfg(0, 0.3, 3)) {
		if k, ok := tenants[it.Tenant]; ok && k != it.Conversation() {
			t.Fatalf("tenant %d's requests have two conversation keys", it.Tenant)
		}
		tenants[it.Tenant] = it.Conversation()
	}
	if len(tenants) < 2 {
		t.Fatal("fewer than two tenants")
	}
	docs := map[string]uint64{}
	agents := map[uint64]bool{}
	items := append(mustPlan(t, planCfg("mixed", 20, 20*time.Second, 7)), mustPlan(t, planCfg("agents", 20, 20*time.Second, 7))...)
	for _, it := range items {
		switch it.Kind {
		case KindRAG:
			doc := it.Messages()[0].Content
			if k, ok := docs[doc]; ok && k != it.Conversation() {
				t.Fatal("two requests on one document have two conversation keys")
			}
			docs[doc] = it.Conversation()
		case KindAgent:
			if agents[it.Conversation()] {
				t.Fatal("two agent sessions share a conversation key")
			}
			agents[it.Conversation()] = true
		}
	}
	if len(docs) < 2 || len(agents) < 2 {
		t.Fatalf("%d documents, %d agents in the plan", len(docs), len(agents))
	}
}
