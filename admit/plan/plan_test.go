package plan

import (
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/carbon"
)

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

const (
	model        = "m"
	adapterModel = "lora-7" // a LoRA adapter of model
)

// newPlanner returns a Planner with the default admission and kvmesh routing for model.
func newPlanner(t testing.TB, cfg Config, grid Grid) *Planner {
	t.Helper()
	ac := admit.DefaultConfig()
	ac.Models = map[string]admit.ModelConfig{model: {ContextTokens: 131072, BlockTokens: 16},
		adapterModel: {ContextTokens: 131072, BlockTokens: 16}}
	adm, err := admit.New(ac)
	if err != nil {
		t.Fatal(err)
	}
	policy, err := route.New(route.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(cfg, adm, policy, grid)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// peer is a healthy peer of model with 8,000 blocks of 16 tokens, a 10k tokens/s prefill and
// a 20 ms decode step.
func peer(name string, mod func(*route.Peer)) route.Peer {
	p := route.Peer{Name: name, Models: []string{model}, Healthy: true, KVBlocksTotal: 8000,
		PrefillTokensPerSecond: 10000, DecodeStepSeconds: 0.02, MaxRunning: 256}
	if mod != nil {
		mod(&p)
	}
	return p
}

func request(prompt int, mod func(*admit.Request)) admit.Request {
	mt := 100
	r := admit.Request{ID: "r", Model: model, Endpoint: "chat", PromptTokens: prompt, MaxTokens: &mt, Arrived: t0}
	if mod != nil {
		mod(&r)
	}
	return r
}

// TestOptionOfCountsTheEngineQueue: the KV admission offers a request is what is left after the
// engine's running and queued work and this node's reservations. The engine's queue is first
// come first served and its head waits for blocks, so the blocks free now are not free for a
// request that will run behind 1,600 queued prefill tokens (100 blocks of 16).
func TestOptionOfCountsTheEngineQueue(t *testing.T) {
	tests := []struct {
		name                   string
		used, queued, reserved int
		wantFree               int
	}{
		{"idle", 0, 0, 0, 1000},
		{"running work", 400, 0, 0, 600},
		{"queued prefill", 400, 1600, 0, 500},
		{"partial block rounds up", 400, 1601, 0, 499},
		{"this node's reservations", 400, 1600, 50, 450},
		{"never negative", 950, 1600, 0, 0},
	}
	p := newPlanner(t, Config{}, nil)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pr := peer("p", func(p *route.Peer) {
				p.KVBlocksTotal, p.KVBlocksUsed, p.QueuedPrefillTokens = 1000, tt.used, tt.queued
			})
			c := &route.Candidate{Peer: 0, Name: "p"}
			c.Terms.ReservedBlocks = tt.reserved
			if got := OptionOf(c, &pr, 0, 16).FreeKVBlocks; got != tt.wantFree {
				t.Errorf("OptionOf free = %d, want %d", got, tt.wantFree)
			}
			if tt.reserved == 0 {
				if got := p.LocalOption(request(100, nil), pr, 16).FreeKVBlocks; got != tt.wantFree {
					t.Errorf("LocalOption free = %d, want %d", got, tt.wantFree)
				}
			}
		})
	}
}

// TestIngressAndOwnerAgree pins the owner's check to the ingress's: on the same state of one
// peer, the ingress's decision (over its view holding that peer) and the owner's (over its
// exact state, the same figures) both accept, or neither does and for the same reason. The
// owner predicts the request's own uncached prefill and the decode step as the ingress does,
// so a long prompt no idle engine can prefill within an explicit TTFT target is refused at
// both, and one with the default target, which grows with its own prefill, is accepted at both.
func TestIngressAndOwnerAgree(t *testing.T) {
	hard := func(r *admit.Request) { r.TTFTSLO = 2 * time.Second }
	tests := []struct {
		name   string
		prompt int
		peer   func(*route.Peer)
		req    func(*admit.Request)
		accept bool
		code   string // when not accepted
	}{
		{"idle", 1000, nil, nil, true, ""},
		{"queued prefill within the target", 1000, func(p *route.Peer) { p.QueuedPrefillTokens = 8000 }, nil, true, ""},
		{"a long prompt's default target grows with it", 25000, nil, nil, true, ""},
		{"own prefill past an explicit target", 25000, nil, hard, false, admit.CodeSLOUnattainable},
		{"cached prefix saves the prefill", 25000, func(p *route.Peer) { p.PrefixBlocks = 1500 }, hard, true, ""},
		{"queue and own prefill past an explicit target", 6000, func(p *route.Peer) { p.QueuedPrefillTokens = 15000 }, hard, false, admit.CodeSLOUnattainable},
		{"queue past the fitted target", 6000, func(p *route.Peer) { p.QueuedPrefillTokens = 30000 }, nil, false, admit.CodeSLOUnattainable},
		{"decode step past the TPOT target", 1000, func(p *route.Peer) { p.DecodeStepSeconds = 0.3 }, nil, false, admit.CodeSLOUnattainable},
		{"KV full", 1000, func(p *route.Peer) { p.KVBlocksUsed = 7700 }, nil, false, admit.CodeWaitKV},
		{"explicit loose SLO", 25000, nil, func(r *admit.Request) { r.TTFTSLO = 10 * time.Second }, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPlanner(t, Config{}, nil)
			req := request(tt.prompt, tt.req)
			pr := peer("owner", tt.peer)

			v := &View{BlockTokens: 16}
			v.Add(peer("ingress", func(p *route.Peer) { p.Self, p.Models = true, nil }), false) // serves another model
			v.Add(pr, false)
			var pl Plan
			p.Ingress(t0, req, v, &pl)
			ingress := pl.D
			p.Release(&pl)

			owner := p.Owner(t0, req, pr, 16, false)
			if got := ingress.Action == admit.Accept; got != tt.accept {
				t.Errorf("ingress: %v %s (%s), want accept %v", ingress.Action, ingress.Code, ingress.Message, tt.accept)
			}
			if got := owner.Action == admit.Accept; got != tt.accept {
				t.Errorf("owner: %v %s (%s), want accept %v", owner.Action, owner.Code, owner.Message, tt.accept)
			}
			if !tt.accept && (ingress.Code != tt.code || owner.Code != tt.code) {
				t.Errorf("codes: ingress %s, owner %s, want %s at both", ingress.Code, owner.Code, tt.code)
			}
			if owner.Action != admit.Accept && owner.Action != admit.Refuse {
				t.Errorf("owner answered %v: it keeps no waiting room", owner.Action)
			}
		})
	}
}

// TestIngressReservesTheAccept: an accept reserves its uncached prefill on the chosen peer, so
// the next decision sees it before gossip does, and Release gives it back.
func TestIngressReservesTheAccept(t *testing.T) {
	p := newPlanner(t, Config{}, nil)
	v := &View{BlockTokens: 16}
	v.Add(peer("a", nil), false)
	var pl Plan
	p.Ingress(t0, request(4000, nil), v, &pl)
	if pl.D.Action != admit.Accept || !pl.Reserved || pl.Res.Peer != "a" || pl.Res.PrefillTokens != 4000 {
		t.Fatalf("decision %+v, reservation %+v (reserved %v)", pl.D, pl.Res, pl.Reserved)
	}
	r := p.Policy().(*route.Router)
	if tokens, _, _ := r.Reserved(t0, "a"); tokens != 4000 {
		t.Fatalf("reserved prefill on a = %d, want 4000", tokens)
	}
	p.Release(&pl)
	if tokens, _, _ := r.Reserved(t0, "a"); tokens != 0 || pl.Reserved {
		t.Fatalf("after Release: reserved %d tokens, plan reserved %v", tokens, pl.Reserved)
	}
}

// TestNoHostIsNoCapacity: a model no peer serves is 503 no_capacity; hosts that are all busy
// are offered as they are, so the request queues instead.
func TestNoHostIsNoCapacity(t *testing.T) {
	p := newPlanner(t, Config{}, nil)
	v := &View{BlockTokens: 16}
	v.Add(peer("a", func(p *route.Peer) { p.Models = []string{"other"} }), false)
	var pl Plan
	p.Ingress(t0, request(100, nil), v, &pl)
	if pl.D.Code != admit.CodeNoCapacity || pl.D.Status != 503 || pl.D.RetryAfter != time.Second {
		t.Fatalf("no host: %+v", pl.D)
	}
	v = &View{BlockTokens: 16}
	v.Add(peer("a", func(p *route.Peer) { p.KVBlocksUsed = 7950 }), false)
	p.Ingress(t0, request(100, nil), v, &pl)
	if pl.D.Action != admit.Queue || pl.D.Code != admit.CodeWaitKV || len(pl.Opts) != 1 || pl.Reserved {
		t.Fatalf("busy host: %+v with %d options", pl.D, len(pl.Opts))
	}
}

// TestBusyAdapterHostQueues: when every host of a LoRA adapter's base model is busy, the
// request waits in the room for one, including a host whose record lists fewer adapters than
// its engine serves (AdaptersCut) and so not this one: routing would run it there, so it is a
// host, and the request is not refused no_capacity.
func TestBusyAdapterHostQueues(t *testing.T) {
	p := newPlanner(t, Config{}, nil)
	adapter := func(r *admit.Request) { r.Model, r.Parent = adapterModel, model }
	for _, tc := range []struct {
		name string
		mod  func(*route.Peer)
		code string
		opts int
	}{
		{"listed", func(p *route.Peer) { p.Models = append(p.Models, adapterModel) }, admit.CodeWaitKV, 1},
		{"past the record's bound", func(p *route.Peer) { p.AdaptersCut, p.LoRASlots = true, 4 }, admit.CodeWaitKV, 1},
		{"no adapter slots", nil, admit.CodeNoCapacity, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := &View{BlockTokens: 16}
			v.Add(peer("a", func(p *route.Peer) {
				p.KVBlocksUsed = 7950
				if tc.mod != nil {
					tc.mod(p)
				}
			}), false)
			var pl Plan
			p.Ingress(t0, request(100, adapter), v, &pl)
			if pl.D.Code != tc.code || len(pl.Opts) != tc.opts {
				t.Fatalf("got %s (%s) with %d options, want %s with %d", pl.D.Code, pl.D.Message, len(pl.Opts), tc.code, tc.opts)
			}
		})
	}
}

// TestSheddableAdapterWaitsForItsSlack: the planner gives routing a request's own slack
// (route.Request.Slack), uncapped by the normal class's target: a sheddable request of an
// adapter resident nowhere waits in the room while more than route's AdapterSheddableSlack of
// it is left (its 30 s target less the dispatch slack, 24 s, less 10 s: 14 s), then takes a
// free slot; an interactive request of the same adapter takes the free slot at once.
func TestSheddableAdapterWaitsForItsSlack(t *testing.T) {
	p := newPlanner(t, Config{}, nil)
	v := &View{BlockTokens: 16}
	v.Add(peer("a", func(p *route.Peer) { p.AdaptersCut, p.LoRASlots, p.LoRAFree = true, 8, 6 }), false)
	sheddable := func(r *admit.Request) { r.Model, r.Parent, r.Priority = adapterModel, model, -1 }
	for _, tc := range []struct {
		name   string
		mod    func(*admit.Request)
		waited time.Duration
		want   admit.Action
	}{
		{"sheddable, just arrived", sheddable, 0, admit.Queue},
		{"sheddable, 13s waited", sheddable, 13 * time.Second, admit.Queue},
		{"sheddable, 15s waited", sheddable, 15 * time.Second, admit.Accept},
		{"interactive, just arrived", func(r *admit.Request) { r.Model, r.Parent = adapterModel, model }, 0, admit.Accept},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pl Plan
			p.Ingress(t0.Add(tc.waited), request(100, tc.mod), v, &pl)
			if pl.D.Action != tc.want {
				t.Fatalf("got %v (%s: %s), want %v", pl.D.Action, pl.D.Code, pl.D.Message, tc.want)
			}
			p.Release(&pl)
		})
	}
}

// grid is a fixed carbon rule: this node's grid dirty or not.
type grid struct{ dirty bool }

func (g grid) Decide(_ time.Time, priority int, others []carbon.Option) carbon.Decision {
	d := carbon.Decide(priority, g.dirty, others)
	if d.Action == carbon.ActionDefer {
		d.RetryAfter = 7 * time.Second
	}
	return d
}

func (g grid) RetryAfter(time.Time) time.Duration { return 7 * time.Second }

// TestCarbonShedsOnlySheddableWork pins the carbon rule in the pipeline: a sheddable request
// runs only on a clean grid (dirty candidates dropped, none left 429 carbon_deferred with the
// grid's Retry-After, at the ingress and at a dirty owner); other priorities are untouched.
func TestCarbonShedsOnlySheddableWork(t *testing.T) {
	low := func(r *admit.Request) { r.Priority = -1 }
	tests := []struct {
		name       string
		selfDirty  bool
		peerDirty  bool
		req        func(*admit.Request)
		wantPeer   string // accepted on; "" refused
		wantRouted bool
	}{
		{"normal on a dirty mesh", true, true, nil, "self", false},
		{"sheddable, clean here", false, true, low, "self", true},
		{"sheddable, dirty here, clean peer", true, false, low, "b", true},
		{"sheddable, all dirty", true, true, low, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPlanner(t, Config{}, grid{tt.selfDirty})
			v := &View{BlockTokens: 16}
			v.Add(peer("self", func(p *route.Peer) { p.Self = true }), tt.selfDirty)
			v.Add(peer("b", func(p *route.Peer) { p.QueuedPrefillTokens = 500 }), tt.peerDirty)
			var pl Plan
			p.Ingress(t0, request(100, tt.req), v, &pl)
			if tt.wantPeer == "" {
				if pl.D.Code != CodeCarbonDeferred || pl.D.Status != 429 || pl.D.RetryAfter != 7*time.Second {
					t.Fatalf("decision %+v, want carbon_deferred with the grid's Retry-After", pl.D)
				}
			} else if pl.D.Action != admit.Accept || pl.Cands[pl.D.Option].Name != tt.wantPeer {
				t.Fatalf("decision %+v over %v, want accept on %s", pl.D, pl.Cands, tt.wantPeer)
			}
			if pl.CarbonRouted != tt.wantRouted {
				t.Errorf("CarbonRouted = %v, want %v", pl.CarbonRouted, tt.wantRouted)
			}
			d := p.Owner(t0, request(100, tt.req), peer("self", nil), 16, false)
			if deferred := d.Code == CodeCarbonDeferred; deferred != (tt.selfDirty && tt.req != nil) {
				t.Errorf("owner: %+v", d)
			}
		})
	}
}

// TestPlainModes: a node without a waiting room sends every valid request to the first
// candidate at once, busy or not; queue-cap refuses once that engine has QueueCap waiting; the
// owner of a plain mesh runs what it is sent.
func TestPlainModes(t *testing.T) {
	busy := peer("a", func(p *route.Peer) { p.KVBlocksUsed, p.Waiting = 7950, 5 })
	for _, tt := range []struct {
		mode Mode
		want admit.Action
	}{{ModeNone, admit.Accept}, {ModeQueueCap, admit.Refuse}} {
		t.Run(tt.mode.String(), func(t *testing.T) {
			p := newPlanner(t, Config{Mode: tt.mode, QueueCap: 5}, nil)
			v := &View{BlockTokens: 16}
			v.Add(busy, false)
			var pl Plan
			p.Ingress(t0, request(100, nil), v, &pl)
			if pl.D.Action != tt.want {
				t.Fatalf("decision %+v, want %v", pl.D, tt.want)
			}
			if d := p.Owner(t0, request(100, nil), busy, 16, false); d.Action != admit.Accept {
				t.Fatalf("owner: %+v, want accept", d)
			}
			if d := p.Owner(t0, request(140000, nil), busy, 16, false); d.Status != 400 {
				t.Fatalf("owner, a request that never fits: %+v, want 400", d)
			}
		})
	}
}

// TestAgentStepsStayHomeWithoutATTFTRefusal: under agent admission, a step of an agent goes
// only to its home and is decided again without its SLO, so it waits for KV room there
// instead of being refused for a predicted TTFT; a known agent's step passes the owner.
func TestAgentStepsStayHomeWithoutATTFTRefusal(t *testing.T) {
	p := newPlanner(t, Config{Agents: true}, nil)
	v := &View{BlockTokens: 16}
	v.Add(peer("home", func(p *route.Peer) { p.AgentKeys = []uint64{route.AgentKey("ag")}; p.Agents = 1 }), false)
	v.Add(peer("other", nil), false)
	req := request(25000, func(r *admit.Request) { r.Agent, r.TTFTSLO = "ag", 2*time.Second })
	var pl Plan
	p.Ingress(t0, req, v, &pl)
	if len(pl.Cands) != 1 || pl.Cands[0].Name != "home" || pl.D.Action != admit.Accept {
		t.Fatalf("decision %+v over %v, want accept at home only", pl.D, pl.Cands)
	}
	if d := p.Owner(t0, req, peer("home", func(p *route.Peer) { p.KVBlocksUsed = 7950 }), 16, true); d.Action != admit.Accept {
		t.Fatalf("owner, known agent: %+v, want accept (its window admits it)", d)
	}
	if d := p.Owner(t0, req, peer("home", func(p *route.Peer) { p.KVBlocksUsed = 7950 }), 16, false); d.Action == admit.Accept {
		t.Fatalf("owner, unknown agent on a full engine: %+v, want a refusal", d)
	}
}

func TestParseMode(t *testing.T) {
	for _, m := range []Mode{ModeKvmesh, ModeNone, ModeQueueCap} {
		if got, err := ParseMode(m.String()); err != nil || got != m {
			t.Errorf("ParseMode(%q) = %v, %v", m, got, err)
		}
	}
	if _, err := ParseMode("fifo"); err == nil {
		t.Error("ParseMode(fifo) accepted")
	}
}

// TestOnlyTheWorkAheadOfTheBandCounts: on an engine that schedules by priority, a high
// request is judged on the prefill queued in its own class and above, not on a sheddable flood
// queued behind it, at the ingress and at the owner alike; on an engine that does not, every
// queued token is ahead of it and it is refused.
func TestOnlyTheWorkAheadOfTheBandCounts(t *testing.T) {
	flood := func(prio bool) func(*route.Peer) {
		return func(p *route.Peer) {
			p.QueuedPrefillTokens, p.QueuedLowWaiting, p.PriorityScheduling = 40000, 40000, prio
			p.KVBlocksUsed = 5000
		}
	}
	high := func(r *admit.Request) { r.Priority, r.TTFTSLO = 10, time.Second }
	for _, tt := range []struct {
		name   string
		prio   bool
		req    func(*admit.Request)
		accept bool
	}{
		{"high, priority engine", true, high, true},
		{"high, first-come engine", false, high, false},
		{"sheddable, priority engine", true, func(r *admit.Request) { r.Priority, r.TTFTSLO = -10, time.Second }, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := newPlanner(t, Config{}, nil)
			pr := peer("owner", flood(tt.prio))
			v := &View{BlockTokens: 16}
			v.Add(pr, false)
			var pl Plan
			req := request(1000, tt.req)
			p.Ingress(t0, req, v, &pl)
			p.Release(&pl)
			owner := p.Owner(t0, req, pr, 16, false)
			if got := pl.D.Action == admit.Accept; got != tt.accept {
				t.Errorf("ingress: %v %s (%s), want accept %v", pl.D.Action, pl.D.Code, pl.D.Message, tt.accept)
			}
			if got := owner.Action == admit.Accept; got != tt.accept {
				t.Errorf("owner: %v %s (%s), want accept %v", owner.Action, owner.Code, owner.Message, tt.accept)
			}
		})
	}
}

// TestLocalityKeepsTheHome: the planner gives routing the request's targets, so its prefix
// home keeps it while the home predicts within half of what is left of them (route's locality
// rule): a 3,200-token prompt whose 3,072-token prefix home h holds, with h's queue at 8,000
// tokens (833 ms at 10k tokens/s) and a peer o with 4,000 (740 ms with its recompute) or 1,000
// (440 ms: sooner than h by more than h's cache saves, so it relieves h).
func TestLocalityKeepsTheHome(t *testing.T) {
	home := func(queued int) func(*route.Peer) {
		return func(p *route.Peer) { p.PrefixBlocks, p.QueuedPrefillTokens = 192, queued }
	}
	tests := []struct {
		name     string
		queued   int // on the home
		other    int // queued on o
		req      func(*admit.Request)
		at       time.Duration // decided this long after arrival
		inRoom   bool          // decided as a waiting-room item
		want     admit.Action
		wantPeer string
	}{
		{"a normal request stays home", 8000, 4000, nil, 0, false, admit.Accept, "h"},
		{"the home past half the target: it leaves", 14000, 4000, nil, 0, false, admit.Accept, "o"},
		{"a request that waited leaves once its home misses what is left", 8000, 1000, nil, 500 * time.Millisecond, false, admit.Accept, "o"},
		{"it stays with a home that misses the margin when the other is barely sooner", 8000, 4000, nil, 500 * time.Millisecond, false, admit.Accept, "h"},
		{"a busy home: the request waits for it", 17000, 15000, func(r *admit.Request) { r.TTFTSLO = 4 * time.Second }, 0, false, admit.Queue, ""},
		{"at the ingress, 1.8 s keeps it home", 8000, 4000, func(r *admit.Request) { r.TTFTSLO = 1800 * time.Millisecond }, 0, false, admit.Accept, "h"},
		{"in the room, the dispatch slack counts", 8000, 1000, func(r *admit.Request) { r.TTFTSLO = 1800 * time.Millisecond }, 0, true, admit.Accept, "o"},
		{"a sheddable request: the normal target at most", 12000, 4000, func(r *admit.Request) { r.Priority, r.TTFTSLO = -1, 30*time.Second }, 0, false, admit.Accept, "o"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPlanner(t, Config{}, nil)
			v := &View{}
			v.Reset(16)
			v.Add(peer("h", home(tt.queued)), false)
			v.Add(peer("o", func(p *route.Peer) { p.QueuedPrefillTokens = tt.other }), false)
			rq := request(3200, func(r *admit.Request) {
				r.TTFTSLO, r.TPOTSLO = 2*time.Second, 200*time.Millisecond
				if tt.req != nil {
					tt.req(r)
				}
			})
			var pl Plan
			now := t0.Add(tt.at)
			if tt.inRoom {
				p.Queued(now, &admit.Item{Req: rq, Priority: rq.Priority, Model: model}, nil, v, &pl)
			} else {
				p.Ingress(now, rq, v, &pl)
			}
			if pl.D.Action != tt.want {
				t.Fatalf("action %v (%s), want %v: %s", pl.D.Action, pl.D.Code, tt.want, route.Explain(pl.Cands, 2))
			}
			if tt.want == admit.Accept && pl.Cands[pl.D.Option].Name != tt.wantPeer {
				t.Fatalf("accepted on %s, want %s: %s", pl.Cands[pl.D.Option].Name, tt.wantPeer, route.Explain(pl.Cands, 2))
			}
		})
	}
}

// TestLocalityWaitsForTheHomesRoom: when routing keeps a request at its prefix home, admission
// chooses among the homes only. A sheddable request whose home h (the prefix, 8,000 tokens
// queued: 853 ms, within the normal target's half) is past the sheddable KV mark (7,000 of
// 8,000 blocks) waits in the room for h's room instead of running on o (4,000 tokens queued,
// 740 ms with its recompute), where it would recompute its 3,072-token prefix and evict another's; o stays the dispatch fallback.
// A home with room takes it. So too for one that waited in the room past the normal target
// (2 s), which its own SLO's remainder (30 s less the dispatch slack, less its wait) still
// keeps home: with no target left the load gate would run it on o.
func TestLocalityWaitsForTheHomesRoom(t *testing.T) {
	for _, tt := range []struct {
		name   string
		kvUsed int           // on the home
		waited time.Duration // in the room (0: at the ingress)
		want   admit.Action
	}{
		{"a home past the sheddable mark: the request waits for it", 7000, 0, admit.Queue},
		{"a home with room takes it", 1000, 0, admit.Accept},
		{"past the normal target, a home past the mark: it still waits for it", 7000, 2500 * time.Millisecond, admit.Queue},
		{"past the normal target, a home with room takes it", 1000, 2500 * time.Millisecond, admit.Accept},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := newPlanner(t, Config{}, nil)
			v := &View{}
			v.Reset(16)
			v.Add(peer("h", func(p *route.Peer) { p.PrefixBlocks, p.QueuedPrefillTokens, p.KVBlocksUsed = 192, 8000, tt.kvUsed }), false)
			v.Add(peer("o", func(p *route.Peer) { p.QueuedPrefillTokens = 4000 }), false)
			rq := request(3200, func(r *admit.Request) { r.Priority, r.TTFTSLO, r.TPOTSLO = -1, 30*time.Second, 200*time.Millisecond })
			var pl Plan
			if tt.waited > 0 {
				p.Queued(t0.Add(tt.waited), &admit.Item{Req: rq, Priority: rq.Priority, Model: model}, nil, v, &pl)
			} else {
				p.Ingress(t0, rq, v, &pl)
			}
			if pl.D.Action != tt.want {
				t.Fatalf("action %v (%s), want %v: %s", pl.D.Action, pl.D.Code, tt.want, route.Explain(pl.Cands, 2))
			}
			if len(pl.Cands) != 2 || pl.Cands[0].Name != "h" || !pl.Cands[1].Gated {
				t.Fatalf("want h first and o behind it as the fallback: %s", route.Explain(pl.Cands, 2))
			}
			if tt.want == admit.Accept && pl.Cands[pl.D.Option].Name != "h" {
				t.Fatalf("accepted on %s, want h", pl.Cands[pl.D.Option].Name)
			}
		})
	}
}
