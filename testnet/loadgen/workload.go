package loadgen

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"time"
)

// Message is one chat message of a request.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Request kinds.
const (
	KindChat  = "chat"  // a short chat turn, ~100 tokens
	KindRAG   = "rag"   // ~4k tokens: a shared document then a question
	KindRepo  = "repo"  // ~100k tokens: a shared repository then a question; rare
	KindAgent = "agent" // one session of steps whose context grows
	KindTrace = "trace" // a replayed trace record
	// KindShared is a shared-prefix request opening a conversation: its tenant's system
	// prompt, then a question; KindFollowUp continues one (see SharedPrefix).
	KindShared   = "shared-prefix"
	KindFollowUp = "follow-up"
)

// Item is one planned arrival: a single request, or an agent session whose first step is sent
// at At and whose later steps follow each answer after a tool wait.
type Item struct {
	At    time.Duration
	Kind  string
	Class Class
	// PromptTokens counts the content tokens of the (first) prompt.
	PromptTokens int
	MaxTokens    int
	// Agent is set for agent sessions.
	Agent *AgentPlan
	// Tenant is a shared-prefix request's tenant (its rank in popularity, from 0) and Turn its
	// place in its conversation: 0 opens one, and a follow-up of Turn n > 0 continues the
	// request of Turn n−1 at index Parent of the plan, its prompt that request's prompt, that
	// request's planned reply (ReplyText) and a question of its own.
	Tenant, Turn, Parent int
	// Adapter is the LoRA adapter an "adapters" workload's request asks for (AdapterName of its
	// tenant), in place of Config.Model; "" for every other workload.
	Adapter string

	p promptSpec
}

// AgentPlan is the fixed part of an agent session: step i+1's prompt is step i's prompt, the
// output step i returned and ToolResult(i).
type AgentPlan struct {
	ID        string
	Steps     int
	ToolWaits []time.Duration // len Steps-1: the pause after step i's answer

	toolKeys  []uint64
	toolBytes []int
}

// ToolResult returns the tool output appended after step i's answer.
func (a *AgentPlan) ToolResult(i int) string { return Text(a.toolKeys[i], a.toolBytes[i]) }

// promptSpec describes a prompt compactly; the text is built only when the request is sent,
// so a plan of 100k-token prompts costs little memory.
type promptSpec struct {
	sysKey    uint64
	sysBytes  int
	userKey   uint64
	userBytes int
	// turns are a follow-up's earlier turns: each a question and its planned reply.
	turns []turn
	// trace prompts: blocks of hash ids, cut to userBytes.
	hashIDs     []int64
	blockTokens int
	trace       bool
}

// turn is one earlier turn of a conversation: a question and the reply planned for it.
type turn struct {
	userKey    uint64
	userBytes  int
	replyBytes int
}

// replyKey is the text key of the reply planned for the question of key userKey.
func replyKey(userKey uint64) uint64 { return mix(userKey ^ 0x7265706c79) }

// ReplyText is the reply a follow-up of it carries as the assistant's turn: MaxTokens tokens of
// text fixed by the plan, whatever the server answered, so a conversation is a function of the
// seed (an engine that caches only prompts' KV reuses the turns before it either way).
func (it Item) ReplyText() string { return Text(replyKey(it.p.userKey), it.MaxTokens*bytesPerToken) }

// Conversation is a key shared by requests that can reuse one another's prefix: a trace
// request's first two blocks (the first is often a system prompt every request carries, and
// conversations part at the second), an agent's session, a synthetic request's system text
// (its tenant's, document's or repository's), else its own question.
func (it Item) Conversation() uint64 {
	p := it.p
	switch {
	case p.trace && len(p.hashIDs) > 0:
		k := mix(uint64(p.hashIDs[0]))
		if len(p.hashIDs) > 1 {
			k = mix(k ^ uint64(p.hashIDs[1]))
		}
		return k
	case it.Agent != nil:
		h := fnv.New64a()
		h.Write([]byte(it.Agent.ID))
		return h.Sum64()
	case p.sysBytes > 0:
		return p.sysKey
	}
	return p.userKey
}

// Messages returns the (first) prompt of the item.
func (it Item) Messages() []Message {
	p := it.p
	if p.trace {
		var b strings.Builder
		b.Grow(p.userBytes)
		for _, id := range p.hashIDs {
			if b.Len() >= p.userBytes {
				break
			}
			b.WriteString(BlockText(id, p.blockTokens))
		}
		// A record whose hash ids do not cover its length is padded with text unique to it.
		if b.Len() < p.userBytes {
			b.WriteString(Text(p.userKey, p.userBytes-b.Len()))
		}
		return []Message{{Role: "user", Content: b.String()[:p.userBytes]}}
	}
	var msgs []Message
	if p.sysBytes > 0 {
		msgs = append(msgs, Message{Role: "system", Content: Text(p.sysKey, p.sysBytes)})
	}
	for _, t := range p.turns {
		msgs = append(msgs, Message{Role: "user", Content: Text(t.userKey, t.userBytes)},
			Message{Role: "assistant", Content: Text(replyKey(t.userKey), t.replyBytes)})
	}
	return append(msgs, Message{Role: "user", Content: Text(p.userKey, p.userBytes)})
}

// Workloads lists the synthetic workload names.
func Workloads() []string {
	return []string{"chat", "rag", "mixed", "bursty", "agents", "shared-prefix", "adapters"}
}

// The "adapters" workload is the shared-prefix workload (SharedPrefix) over LoRA adapters of
// one base model: each tenant is an adapter, its requests ask for AdapterName(tenant), and
// its system prompt is the adapter's. Tenants is the adapter count (50 to 500 is the shape of
// a multi-tenant fine-tuning fleet) and TenantZipf their popularity.
const WorkloadAdapters = "adapters"

// AdapterName is the name of the adapters workload's adapter of rank t.
func AdapterName(t int) string { return fmt.Sprintf("lora-%03d", t) }

// Burst shape of the "bursty" workload: the first BurstOnFraction of every Config.BurstPeriod at
// BurstHigh×rate, the rest at BurstLow×rate, which averages to the configured rate.
const (
	DefaultBurstPeriod = 4 * time.Second
	BurstOnFraction    = 0.25
	BurstHigh          = 3.4
	BurstLow           = 0.2
)

// Sizes of the synthetic prompts, in tokens.
const (
	ragDocs        = 16
	ragDocTokens   = 3600
	repos          = 2
	repoTokens     = 98000
	agentSysTokens = 1500
	// A shared-prefix conversation has at most maxTurns requests; a follow-up drawn for a
	// tenant whose latest conversation has them all opens a new one.
	maxTurns = 4
	// sharedInteractive is the interactive share of shared-prefix conversations.
	sharedInteractive = 0.7
)

// Plan returns the arrivals cfg describes, sorted by At, without sending anything. It reads
// cfg.Trace when set. Plan is deterministic: the same cfg gives the same items.
func Plan(cfg Config) ([]Item, error) {
	items, _, err := plan(cfg)
	return items, err
}

// plan is Plan, also reporting whether a trace ran out of requests before cfg.Duration.
func plan(cfg Config) (items []Item, traceEnded bool, err error) {
	cfg, err = cfg.validate()
	if err != nil {
		return nil, false, err
	}
	if cfg.Trace == "" {
		items, err = synthetic(cfg)
		return items, false, err
	}
	recs, cut, err := readTraceFile(cfg.Trace, traceWindow(cfg))
	if err != nil {
		return nil, false, err
	}
	items = TraceItems(cfg, recs)
	traceEnded = cfg.Duration > 0 && !cut && len(items) == len(recs) &&
		(cfg.MaxRequests == 0 || len(items) < cfg.MaxRequests)
	return items, traceEnded, nil
}

// traceWindow is the span of trace time that cfg's Duration replays (0: all of it), with slack
// for rounding: TraceItems makes the exact cut.
func traceWindow(cfg Config) time.Duration {
	w := float64(cfg.Duration) * cfg.Speedup * cfg.Rate * (1 + 1e-9)
	if cfg.Duration <= 0 || w >= math.MaxInt64/2 {
		return 0
	}
	return time.Duration(w) + 1
}

// generator holds one synthetic plan's random state.
type generator struct {
	cfg      Config
	r        *rand.Rand
	zipf     *rand.Zipf
	seed     uint64
	sessions int
	items    []Item
	// shared-prefix: the tenants' cumulative popularity (the last is 1), and the plan index of
	// each tenant's latest request (-1: none yet).
	tenantCDF []float64
	latest    []int
}

func synthetic(cfg Config) ([]Item, error) {
	if !slices.Contains(Workloads(), cfg.Workload) {
		return nil, fmt.Errorf("%w: %q (have %s)", ErrUnknownWorkload, cfg.Workload, strings.Join(Workloads(), ", "))
	}
	g := &generator{cfg: cfg, seed: uint64(cfg.Seed)}
	stream := uint64(0x6c6f616467656e)
	if cfg.Variant != 0 {
		stream ^= mix(cfg.Variant)
	}
	g.r = rand.New(rand.NewPCG(g.seed, stream))
	g.zipf = rand.NewZipf(g.r, 1.2, 1, ragDocs-1)
	if cfg.Workload == "shared-prefix" || cfg.Workload == WorkloadAdapters {
		g.tenantCDF = TenantShares(cfg.SharedPrefix.Tenants, cfg.SharedPrefix.TenantZipf)
		for i := 1; i < len(g.tenantCDF); i++ {
			g.tenantCDF[i] += g.tenantCDF[i-1]
		}
		g.latest = make([]int, cfg.SharedPrefix.Tenants)
		for i := range g.latest {
			g.latest[i] = -1
		}
	}

	rate := cfg.Rate
	if cfg.Workload == "agents" {
		rate /= 5.5 // sessions/s: the mean session has 5.5 steps
	}
	planned := 0 // requests, counting every agent step
	t := time.Duration(0)
	for {
		t = g.nextArrival(t, rate)
		if cfg.Duration > 0 && t >= cfg.Duration {
			break
		}
		if cfg.MaxRequests > 0 && planned >= cfg.MaxRequests {
			break
		}
		it := g.item(t)
		planned++
		if it.Agent != nil {
			planned += it.Agent.Steps - 1
		}
		g.items = append(g.items, it)
	}
	return g.items, nil
}

// nextArrival draws the next arrival after t: Poisson at rate, or for "bursty" a Poisson process
// whose rate switches between BurstHigh and BurstLow times rate (sampled by thinning).
func (g *generator) nextArrival(t time.Duration, rate float64) time.Duration {
	if g.cfg.Workload != "bursty" {
		return t + seconds(g.r.ExpFloat64()/rate)
	}
	peak := BurstHigh * rate
	period := g.cfg.BurstPeriod
	on := time.Duration(BurstOnFraction * float64(period))
	for {
		t += seconds(g.r.ExpFloat64() / peak)
		r := BurstLow * rate
		if t%period < on {
			r = peak
		}
		if g.r.Float64()*peak < r {
			return t
		}
	}
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// between draws an integer uniformly in [lo, hi].
func (g *generator) between(lo, hi int) int { return lo + g.r.IntN(hi-lo+1) }

// key derives a text key for a named shared thing (a document, a repo) under the seed.
func (g *generator) key(kind, id uint64) uint64 { return mix(g.seed ^ mix(kind<<32|id)) }

func (g *generator) class(interactive float64) Class {
	if g.r.Float64() < interactive {
		return g.cfg.Interactive
	}
	return g.cfg.Batch
}

func (g *generator) item(at time.Duration) Item {
	switch g.cfg.Workload {
	case "shared-prefix":
		return g.shared(at)
	case WorkloadAdapters:
		it := g.shared(at)
		it.Adapter = AdapterName(it.Tenant)
		return it
	}
	kind := KindChat
	switch g.cfg.Workload {
	case "rag":
		kind = KindRAG
	case "agents":
		kind = KindAgent
	case "mixed", "bursty":
		switch u := g.r.Float64(); {
		case u < 0.01:
			kind = KindRepo
		case u < 0.20:
			kind = KindRAG
		}
	}
	it := Item{At: at, Kind: kind}
	sysTokens, userTokens := 0, 0
	switch kind {
	case KindChat:
		it.Class = g.class(0.8)
		userTokens = g.between(60, 140)
		it.MaxTokens = g.between(32, 128)
	case KindRAG:
		it.Class = g.class(0.5)
		doc := g.zipf.Uint64()
		sysTokens, it.p.sysKey = ragDocTokens, g.key(1, doc)
		userTokens = g.between(100, 500)
		it.MaxTokens = g.between(128, 256)
	case KindRepo:
		it.Class = g.cfg.Batch
		repo := uint64(g.r.IntN(repos))
		sysTokens, it.p.sysKey = repoTokens, g.key(2, repo)
		userTokens = g.between(200, 2000)
		it.MaxTokens = g.between(256, 512)
	case KindAgent:
		it.Class = g.cfg.Interactive
		sysTokens, it.p.sysKey = agentSysTokens, g.key(3, 0)
		userTokens = g.between(100, 300)
		it.MaxTokens = g.between(64, 192)
		steps := g.between(3, 8)
		g.sessions++
		id := fmt.Sprintf("agent-%d-%d", g.cfg.Seed, g.sessions)
		if g.cfg.Variant != 0 {
			id = fmt.Sprintf("agent-%d.%d-%d", g.cfg.Seed, g.cfg.Variant, g.sessions)
		}
		a := &AgentPlan{ID: id, Steps: steps}
		for range steps - 1 {
			a.ToolWaits = append(a.ToolWaits, time.Duration(g.r.ExpFloat64()*float64(g.cfg.ToolWait)))
			a.toolKeys = append(a.toolKeys, g.r.Uint64())
			a.toolBytes = append(a.toolBytes, int(float64(g.between(100, 800))*g.cfg.ToolScale)*bytesPerToken)
		}
		it.Agent = a
	}
	it.p.sysBytes = sysTokens * bytesPerToken
	it.p.userKey = g.r.Uint64()
	it.p.userBytes = userTokens * bytesPerToken
	it.PromptTokens = sysTokens + userTokens
	return it
}

// TenantShares returns the popularity of n tenants ranked from 0: tenant k's share is
// ∝ (k+1)^−s, so s = 0 is uniform and a larger s more skewed. The shares sum to 1.
func TenantShares(n int, s float64) []float64 {
	w := make([]float64, n)
	sum := 0.0
	for k := range w {
		w[k] = math.Pow(float64(k+1), -s)
		sum += w[k]
	}
	for k := range w {
		w[k] /= sum
	}
	return w
}

// shared plans a shared-prefix request at at: a tenant drawn by popularity, then either a
// follow-up of the tenant's latest conversation (with probability FollowUps, if the tenant has
// one and it has fewer than maxTurns requests) or a new conversation. Every draw is made whichever it is,
// so the stream of tenants and lengths does not depend on the follow-ups.
func (g *generator) shared(at time.Duration) Item {
	sp := g.cfg.SharedPrefix
	u := g.r.Float64()
	t := min(sort.Search(sp.Tenants, func(i int) bool { return g.tenantCDF[i] > u }), sp.Tenants-1)
	follow := g.r.Float64() < sp.FollowUps
	it := Item{At: at, Kind: KindShared, Tenant: t, Class: g.class(sharedInteractive)}
	question := g.spread(sp.QuestionTokens, 0.5, 1.5)
	it.MaxTokens = g.spread(sp.ReplyTokens, 0.75, 1.25)
	sysTokens := g.systemTokens(t)
	it.p = promptSpec{sysKey: g.key(4, uint64(t)), sysBytes: sysTokens * bytesPerToken, userKey: g.r.Uint64(), userBytes: question * bytesPerToken}
	it.PromptTokens = sysTokens + question
	if last := g.latest[t]; follow && last >= 0 && g.items[last].Turn < maxTurns-1 {
		parent := &g.items[last]
		it.Kind, it.Turn, it.Parent, it.Class = KindFollowUp, parent.Turn+1, last, parent.Class
		it.p.turns = append(slices.Clip(parent.p.turns), turn{userKey: parent.p.userKey, userBytes: parent.p.userBytes, replyBytes: parent.MaxTokens * bytesPerToken})
		it.PromptTokens = parent.PromptTokens + parent.MaxTokens + question
	}
	g.latest[t] = len(g.items)
	return it
}

// spread draws n × a factor uniform in [lo, hi], rounded, at least 1.
func (g *generator) spread(n int, lo, hi float64) int {
	return max(1, int(math.Round(float64(n)*(lo+(hi-lo)*g.r.Float64()))))
}

// systemTokens is tenant t's system prompt length: SystemTokens × a factor in [0.75, 1.25]
// fixed by the seed and t alone, as the text is.
func (g *generator) systemTokens(t int) int {
	f := 0.75 + 0.5*float64(g.key(5, uint64(t))>>11)/(1<<53)
	return max(1, int(math.Round(float64(g.cfg.SharedPrefix.SystemTokens)*f)))
}

// TraceItems turns trace records into items under cfg's Speedup, Rate (a load multiplier),
// Scale, Duration, MaxRequests and TraceBatchFraction.
func TraceItems(cfg Config, recs []TraceRecord) []Item {
	speed := cfg.Speedup * cfg.Rate
	if speed <= 0 {
		speed = 1
	}
	scale := cfg.Scale
	if scale <= 0 {
		scale = 1
	}
	scaled := func(n int) int { return max(1, int(math.Round(float64(n)*scale))) }
	blockTokens := scaled(MooncakeBlockTokens)
	r := rand.New(rand.NewPCG(uint64(cfg.Seed), 0x7472616365))
	n := len(recs)
	if cfg.MaxRequests > 0 {
		n = min(n, cfg.MaxRequests) // --max-requests of a week-long trace allocates what it sends
	}
	items := make([]Item, 0, n)
	for i, rec := range recs {
		at := time.Duration(float64(rec.At) / speed)
		if cfg.Duration > 0 && at >= cfg.Duration {
			break
		}
		if cfg.MaxRequests > 0 && len(items) >= cfg.MaxRequests {
			break
		}
		class := cfg.Interactive
		if r.Float64() < cfg.TraceBatchFraction {
			class = cfg.Batch
		}
		in := scaled(rec.InputTokens)
		items = append(items, Item{
			At: at, Kind: KindTrace, Class: class, PromptTokens: in, MaxTokens: scaled(rec.OutputTokens),
			p: promptSpec{
				trace: true, hashIDs: rec.HashIDs, blockTokens: blockTokens,
				userKey: mix(uint64(cfg.Seed) ^ mix(uint64(i)+1<<40)), userBytes: in * bytesPerToken,
			},
		})
	}
	return items
}
