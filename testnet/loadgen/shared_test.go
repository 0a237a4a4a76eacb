package loadgen

import (
	"math"
	"reflect"
	"slices"
	"testing"
	"time"
)

func sharedCfg(zipf, followUps float64, seed int64) Config {
	cfg := planCfg("shared-prefix", 50, 200*time.Second, seed)
	cfg.SharedPrefix.TenantZipf, cfg.SharedPrefix.FollowUps = zipf, followUps
	return cfg
}

func contentBytes(msgs []Message) int {
	n := 0
	for _, m := range msgs {
		n += len(m.Content)
	}
	return n
}

// TestSharedPrefixTenants pins down what a tenant's requests share: one system prompt, byte
// for byte, of a length in [0.75, 1.25] × SystemTokens that differs between tenants; a
// question of its own per request; lengths within their spreads; and the classes' shares.
func TestSharedPrefixTenants(t *testing.T) {
	cfg := sharedCfg(0, 0, 3)
	sp := cfg.SharedPrefix
	items := mustPlan(t, cfg)
	system := map[int]string{}
	questions := map[string]bool{}
	sysLens := map[int]bool{}
	interactive := 0
	for _, it := range items {
		if it.Kind != KindShared || it.Turn != 0 {
			t.Fatalf("without follow-ups, got kind %s turn %d", it.Kind, it.Turn)
		}
		msgs := it.Messages()
		if len(msgs) != 2 || msgs[0].Role != "system" || msgs[1].Role != "user" {
			t.Fatalf("shared-prefix prompt %v: want system then user", msgs)
		}
		if s, ok := system[it.Tenant]; ok && s != msgs[0].Content {
			t.Fatalf("tenant %d's system prompt differs between its requests", it.Tenant)
		}
		system[it.Tenant] = msgs[0].Content
		sysLens[len(msgs[0].Content)] = true
		if questions[msgs[1].Content] {
			t.Fatal("two requests share a question")
		}
		questions[msgs[1].Content] = true
		if contentBytes(msgs) != it.PromptTokens*bytesPerToken {
			t.Fatalf("%d bytes for %d tokens", contentBytes(msgs), it.PromptTokens)
		}
		for _, c := range []struct {
			name    string
			n, want int
			lo, hi  float64
		}{
			{"system", len(msgs[0].Content) / bytesPerToken, sp.SystemTokens, 0.75, 1.25},
			{"question", len(msgs[1].Content) / bytesPerToken, sp.QuestionTokens, 0.5, 1.5},
			{"reply", it.MaxTokens, sp.ReplyTokens, 0.75, 1.25},
		} {
			if f := float64(c.n); f < c.lo*float64(c.want)-1 || f > c.hi*float64(c.want)+1 {
				t.Fatalf("%s of %d tokens outside [%v, %v] × %d", c.name, c.n, c.lo, c.hi, c.want)
			}
		}
		if it.Class == cfg.Interactive {
			interactive++
		}
	}
	if len(system) != sp.Tenants {
		t.Fatalf("%d tenants sent requests, want all %d", len(system), sp.Tenants)
	}
	if len(sysLens) < sp.Tenants/2 {
		t.Fatalf("%d distinct system prompt lengths over %d tenants: no spread", len(sysLens), sp.Tenants)
	}
	for k, v := range system {
		for k2, v2 := range system {
			if k != k2 && v[:64] == v2[:64] {
				t.Fatalf("tenants %d and %d share their system prompt's start", k, k2)
			}
		}
	}
	n := float64(len(items))
	if got := float64(interactive) / n; math.Abs(got-sharedInteractive) > 4*math.Sqrt(sharedInteractive*(1-sharedInteractive)/n) {
		t.Fatalf("interactive share %.3f, want %v", got, sharedInteractive)
	}
}

// TestSharedPrefixPopularity checks the tenants' shares of requests: uniform at TenantZipf 0,
// ∝ (rank+1)^−s otherwise, within four standard deviations per tenant.
func TestSharedPrefixPopularity(t *testing.T) {
	for _, s := range []float64{0, 1.1} {
		cfg := sharedCfg(s, 0, 5)
		items := mustPlan(t, cfg)
		counts := make([]int, cfg.SharedPrefix.Tenants)
		for _, it := range items {
			counts[it.Tenant]++
		}
		n := float64(len(items))
		for k, p := range TenantShares(cfg.SharedPrefix.Tenants, s) {
			if sd := math.Sqrt(n * p * (1 - p)); math.Abs(float64(counts[k])-n*p) > 4*sd+1 {
				t.Fatalf("zipf %v: tenant %d got %d requests of %v, want %.1f ± %.1f", s, k, counts[k], n, n*p, 4*sd)
			}
		}
		if s > 0 && counts[0] < 20*counts[len(counts)-1] {
			t.Fatalf("zipf %v: the top tenant got %d requests, the last %d: no skew", s, counts[0], counts[len(counts)-1])
		}
	}
	if w := TenantShares(4, 1); math.Abs(w[0]/w[3]-4) > 1e-9 || math.Abs(w[0]+w[1]+w[2]+w[3]-1) > 1e-9 {
		t.Fatalf("TenantShares(4, 1) = %v: want ∝ 1, 1/2, 1/3, 1/4", w)
	}
}

// TestSharedPrefixFollowUps checks that a follow-up's prompt is its parent's prompt, the
// parent's planned reply and a new question; that it is later, of the same tenant and class,
// and that about FollowUps of requests are follow-ups (fewer where conversations hit maxTurns).
func TestSharedPrefixFollowUps(t *testing.T) {
	cfg := sharedCfg(0.8, 0.4, 9)
	items := mustPlan(t, cfg)
	follow, turns := 0, make([]int, maxTurns)
	for i, it := range items {
		turns[it.Turn]++
		if it.Turn == 0 {
			if it.Kind != KindShared {
				t.Fatalf("item %d: turn 0 of kind %s", i, it.Kind)
			}
			continue
		}
		follow++
		if it.Kind != KindFollowUp || it.Parent >= i {
			t.Fatalf("item %d: kind %s, parent %d", i, it.Kind, it.Parent)
		}
		p := items[it.Parent]
		if p.Tenant != it.Tenant || p.Class != it.Class || p.Turn != it.Turn-1 || p.At > it.At {
			t.Fatalf("item %d continues item %d: tenant %d/%d, class %s/%s, turn %d/%d", i, it.Parent, it.Tenant, p.Tenant, it.Class.Name, p.Class.Name, it.Turn, p.Turn)
		}
		msgs, pm := it.Messages(), p.Messages()
		want := append(slices.Clone(pm), Message{Role: "assistant", Content: p.ReplyText()})
		if len(msgs) != len(want)+1 || !reflect.DeepEqual(msgs[:len(want)], want) || msgs[len(want)].Role != "user" {
			t.Fatalf("item %d does not extend item %d's prompt and reply", i, it.Parent)
		}
		if msgs[len(want)].Content == pm[len(pm)-1].Content {
			t.Fatalf("item %d repeats its parent's question", i)
		}
		if len(p.ReplyText()) != p.MaxTokens*bytesPerToken || contentBytes(msgs) != it.PromptTokens*bytesPerToken {
			t.Fatalf("item %d: lengths in tokens disagree with the text", i)
		}
	}
	if turns[maxTurns-1] == 0 {
		t.Fatalf("no conversation reached %d turns: %v", maxTurns, turns)
	}
	got := float64(follow) / float64(len(items))
	if got > cfg.SharedPrefix.FollowUps+0.02 || got < 0.8*cfg.SharedPrefix.FollowUps {
		t.Fatalf("follow-up share %.3f, want about %v (turns %v)", got, cfg.SharedPrefix.FollowUps, turns)
	}
}

// TestVariantKeepsSharedTexts checks that another Variant draws other requests over the same
// shared texts: the same tenants' system prompts, no question in common.
func TestVariantKeepsSharedTexts(t *testing.T) {
	a := mustPlan(t, sharedCfg(0, 0.3, 4))
	cfg := sharedCfg(0, 0.3, 4)
	cfg.Variant = 1
	b := mustPlan(t, cfg)
	sys, questions := map[int]string{}, map[string]bool{}
	for _, it := range a {
		m := it.Messages()
		sys[it.Tenant], questions[m[len(m)-1].Content] = m[0].Content, true
	}
	same := 0
	for _, it := range b {
		m := it.Messages()
		if m[0].Content != sys[it.Tenant] {
			t.Fatalf("variant 1 changed tenant %d's system prompt", it.Tenant)
		}
		if questions[m[len(m)-1].Content] {
			t.Fatal("variant 1 sent a question of variant 0")
		}
		if it.Tenant == a[0].Tenant {
			same++
		}
	}
	if reflect.DeepEqual(a[0].At, b[0].At) && a[0].Tenant == b[0].Tenant {
		t.Fatal("variant 1 drew variant 0's first request")
	}
	if same == 0 {
		t.Fatal("variant 1 never drew variant 0's first tenant")
	}
}

// TestAdaptersWorkload pins the adapters workload: the shared-prefix plan, each request asking
// for its tenant's adapter, and sent with that adapter as its model.
func TestAdaptersWorkload(t *testing.T) {
	cfg := sharedCfg(1.1, 0.3, 5)
	shared := mustPlan(t, cfg)
	cfg.Workload = WorkloadAdapters
	items := mustPlan(t, cfg)
	if len(items) != len(shared) || len(items) == 0 {
		t.Fatalf("%d adapter items, %d shared-prefix ones: want the same plan", len(items), len(shared))
	}
	r := &runner{cfg: cfg}
	for i, it := range items {
		if it.Tenant != shared[i].Tenant || it.PromptTokens != shared[i].PromptTokens || it.Adapter != AdapterName(it.Tenant) {
			t.Fatalf("item %d: tenant %d adapter %q, want shared-prefix's tenant %d and its adapter", i, it.Tenant, it.Adapter, shared[i].Tenant)
		}
		if m, _ := r.modelOf(&items[i]); m != it.Adapter {
			t.Fatalf("item %d asks for model %q, want its adapter %q", i, m, it.Adapter)
		}
	}
}
