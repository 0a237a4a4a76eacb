package route

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// only turns off the terms w leaves zero (a zero weight would take its default).
func only(w Weights) Weights {
	for _, v := range []*float64{&w.Prefix, &w.Load, &w.FreeKV, &w.Power, &w.Thermal, &w.Adapter} {
		if *v == 0 {
			*v = -1
		}
	}
	return w
}

// TestConfigZeroRule pins that a zero field takes its default and that filling keeps the
// negative values that turn settings off.
func TestConfigZeroRule(t *testing.T) {
	r, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprintf("%+v", r.Config()), fmt.Sprintf("%+v", DefaultConfig()); got != want {
		t.Errorf("New(Config{}) filled\n%s\nwant\n%s", got, want)
	}
	off := DefaultConfig()
	off.Weights.Load, off.DecodeBatchShare, off.GateTolerance, off.Epsilon, off.ObserveMargin, off.BusyWaiting = -1, -1, -1, -1, -1, -1
	r, err = New(off)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprintf("%+v", r.Config()), fmt.Sprintf("%+v", off); got != want {
		t.Errorf("filling changed the negatives:\n%s\nwant\n%s", got, want)
	}
	b, err := off.StalePolicy.MarshalText()
	var back StalePolicy
	if err != nil || back.UnmarshalText(b) != nil || back != off.StalePolicy || string(b) != "closed" {
		t.Errorf("stale policy text %q, %v: read back %v", b, err, back)
	}
}

func TestConfigValidation(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
		ok   bool
	}{
		{"defaults", func(*Config) {}, true},
		{"zero config fills defaults", func(c *Config) { *c = Config{} }, true},
		{"zero weights take the defaults", func(c *Config) { c.Weights = Weights{} }, true},
		{"a negative weight turns its term off", func(c *Config) { c.Weights.Load = -1 }, true},
		{"NaN weight", func(c *Config) { c.Weights.Prefix = math.NaN() }, false},
		{"infinite weight", func(c *Config) { c.Weights.Prefix = math.Inf(1) }, false},
		{"kv use over 1", func(c *Config) { c.BusyKVUse = 1.5 }, false},
		{"negative kv use", func(c *Config) { c.BusyKVUse = -0.1 }, false},
		{"soft above hard", func(c *Config) { c.ThermalSoftC, c.ThermalHardC = 95, 90 }, false},
		{"hard limit not positive", func(c *Config) { c.ThermalSoftC, c.ThermalHardC = -10, -5 }, false},
		{"unknown stale policy", func(c *Config) { c.StalePolicy = 7 }, false},
		{"negative max age", func(c *Config) { c.MaxAge = -time.Second }, false},
		{"batch share over 1", func(c *Config) { c.DecodeBatchShare = 2 }, false},
		{"negative epsilon: exact ties only", func(c *Config) { c.Epsilon = -1 }, true},
		{"infinite epsilon", func(c *Config) { c.Epsilon = math.Inf(1) }, false},
		{"negative ttl", func(c *Config) { c.ReservationTTL = -1 }, false},
		{"negative tolerance: none", func(c *Config) { c.GateTolerance = -1 }, true},
		{"negative max slack", func(c *Config) { c.GateMaxSlack = -1 }, false},
		{"negative prefill rate", func(c *Config) { c.DefaultPrefillTokensPerSecond = -5 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tt.mod(&cfg)
			_, err := New(cfg)
			if (err == nil) != tt.ok {
				t.Fatalf("New err = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && (!errors.Is(err, ErrInvalidConfig) || !strings.HasPrefix(err.Error(), "route: ")) {
				t.Fatalf("error %q does not wrap ErrInvalidConfig with the package prefix", err)
			}
		})
	}
	if p, err := ParseStalePolicy("open"); err != nil || p != StaleOpen || p.String() != "open" {
		t.Fatalf("ParseStalePolicy(open) = %v, %v", p, err)
	}
	if _, err := ParseStalePolicy("sometimes"); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("ParseStalePolicy(sometimes) err = %v", err)
	}
}

func TestFilters(t *testing.T) {
	const gib = 1 << 30
	tests := []struct {
		name     string
		cfg      func(*Config)
		bad      func(*Peer) // peer "bad"
		good     func(*Peer) // peer "good"
		reserve  func(*Router)
		prompt   int
		want     []string // surviving names, any order
		wantDrop Reason
	}{
		{name: "other model", bad: func(p *Peer) { p.Models = []string{"other"} }, want: []string{"good"}, wantDrop: ReasonModel},
		{name: "stale by age", bad: func(p *Peer) { p.Age = 4 * time.Second }, want: []string{"good"}, wantDrop: ReasonStale},
		{name: "stale flag", bad: func(p *Peer) { p.Stale = true }, want: []string{"good"}, wantDrop: ReasonStale},
		{name: "self never stale", bad: func(p *Peer) { p.Self, p.Age, p.Stale = true, time.Hour, true }, want: []string{"bad", "good"}},
		{name: "stale open keeps", cfg: func(c *Config) { c.StalePolicy = StaleOpen }, bad: func(p *Peer) { p.Age = time.Hour }, want: []string{"bad", "good"}},
		{name: "unhealthy", bad: func(p *Peer) { p.Healthy = false }, want: []string{"good"}, wantDrop: ReasonUnhealthy},
		{name: "ejected", bad: func(p *Peer) { p.Ejected = true }, want: []string{"good"}, wantDrop: ReasonEjected},
		{name: "vram too small", cfg: func(c *Config) { c.ModelBytes = map[string]uint64{"m": 40 * gib} },
			bad: func(p *Peer) { p.VRAMTotalBytes = 24 * gib }, want: []string{"good"}, wantDrop: ReasonCapability},
		{name: "vram unknown passes", cfg: func(c *Config) { c.ModelBytes = map[string]uint64{"m": 40 * gib} },
			bad: func(p *Peer) { p.VRAMTotalBytes = 0 }, want: []string{"bad", "good"}},
		{name: "wrong vendor", cfg: func(c *Config) { c.ModelVendors = map[string][]string{"m": {"nvidia"}} },
			bad: func(p *Peer) { p.Vendor = "amd" }, want: []string{"good"}, wantDrop: ReasonCapability},
		{name: "wrong role", cfg: func(c *Config) { c.Roles = []string{"mixed"} },
			bad: func(p *Peer) { p.Role = "decode" }, good: func(p *Peer) { p.Role = "mixed" }, want: []string{"good"}, wantDrop: ReasonCapability},
		{name: "default role is mixed", cfg: func(c *Config) { c.Roles = []string{"mixed"} },
			bad: func(p *Peer) { p.Role = "gpu-a" }, good: func(p *Peer) { p.Role = "" }, want: []string{"good"}, wantDrop: ReasonCapability},
		{name: "busy kv", bad: func(p *Peer) { p.KVBlocksUsed = 900 }, want: []string{"good"}, wantDrop: ReasonBusy},
		// A 2048-token prompt and 128 output tokens add 136 blocks: 814 + 136 is 95% of 1000.
		{name: "kv at threshold is not busy", bad: func(p *Peer) { p.KVBlocksUsed = 814 }, want: []string{"bad", "good"}},
		{name: "kv over threshold with the request", bad: func(p *Peer) { p.KVBlocksUsed = 815 }, want: []string{"good"}, wantDrop: ReasonBusy},
		// One long prompt holds 90% of the pool: a chat turn (12 blocks) still fits.
		{name: "short prompt beside a long one", bad: func(p *Peer) { p.KVBlocksUsed = 900 }, prompt: 60, want: []string{"bad", "good"}},
		// The holder of the whole prompt adds only the output's 8 blocks.
		{name: "prefix holder adds only new blocks", bad: func(p *Peer) { p.KVBlocksUsed, p.PrefixBlocks = 900, 128 }, want: []string{"bad", "good"}},
		{name: "busy kv with own reservations", bad: func(p *Peer) { p.KVBlocksUsed = 800 },
			reserve: func(r *Router) { r.Reserve(t0, "bad", 0, 100) }, want: []string{"good"}, wantDrop: ReasonBusy},
		{name: "busy queued prefill", bad: func(p *Peer) { p.QueuedPrefillTokens = 20000 }, want: []string{"good"}, wantDrop: ReasonBusy},
		{name: "busy engine queue", bad: func(p *Peer) { p.Waiting = 5 }, want: []string{"good"}, wantDrop: ReasonBusy},
		{name: "busy queued with own reservations", bad: func(p *Peer) { p.QueuedPrefillTokens = 10000 },
			reserve: func(r *Router) { r.Reserve(t0, "bad", 8000, 0) }, want: []string{"good"}, wantDrop: ReasonBusy},
		{name: "long prompt on idle peer not busy", prompt: 100000, want: []string{"bad", "good"}},
		{name: "over power cap", bad: func(p *Peer) { p.PowerWatts = 700 }, want: []string{"good"}, wantDrop: ReasonPowerCap},
		{name: "all over power cap kept", bad: func(p *Peer) { p.PowerWatts = 700 }, good: func(p *Peer) { p.PowerWatts = 710 }, want: []string{"bad", "good"}},
		{name: "power filter off", cfg: func(c *Config) { c.DisablePowerCapFilter = true }, bad: func(p *Peer) { p.PowerWatts = 700 }, want: []string{"bad", "good"}},
		{name: "over cap kept when the only under-cap peer is too hot", bad: func(p *Peer) { p.PowerWatts = 700 },
			good: func(p *Peer) { p.TempC = 95 }, want: []string{"bad"}, wantDrop: ReasonThermal},
		{name: "thermal hard limit", bad: func(p *Peer) { p.TempC = 90 }, want: []string{"good"}, wantDrop: ReasonThermal},
		{name: "thermal soft limit kept", bad: func(p *Peer) { p.TempC = 85 }, want: []string{"bad", "good"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRouter(t, tt.cfg)
			peers := []Peer{idle("bad"), idle("good")}
			if tt.bad != nil {
				tt.bad(&peers[0])
			}
			if tt.good != nil {
				tt.good(&peers[1])
			}
			if tt.reserve != nil {
				tt.reserve(r)
			}
			prompt := tt.prompt
			if prompt == 0 {
				prompt = 2048
			}
			cands := mustRoute(t, r, t0, req(prompt), peers)
			got := names(cands)
			slices.Sort(got)
			if !slices.Equal(got, tt.want) {
				t.Fatalf("candidates %v, want %v", got, tt.want)
			}
			var want FilterCounts
			if len(tt.want) < 2 {
				want[tt.wantDrop] = 1
			}
			if c := r.Counts(); c != want {
				t.Fatalf("counts %v, want %v", c, want)
			}
		})
	}
}

func TestNoCandidateError(t *testing.T) {
	tests := []struct {
		name         string
		mod          func(*Peer)
		noHost, busy bool
		text         string
	}{
		{"no host", func(p *Peer) { p.Models = []string{"x"} }, true, false, "model=3"},
		{"all busy", func(p *Peer) { p.QueuedPrefillTokens = 1 << 20 }, false, true, "busy=3"},
		{"all too hot", func(p *Peer) { p.TempC = 99 }, false, true, "thermal=3"},
		{"all stale", func(p *Peer) { p.Stale = true }, false, false, "stale=3"},
		{"all unhealthy", func(p *Peer) { p.Healthy = false }, false, false, "unhealthy=3"},
		{"all ejected", func(p *Peer) { p.Ejected = true }, false, true, "ejected=3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRouter(t, nil)
			peers := idlePeers(3)
			for i := range peers {
				tt.mod(&peers[i])
			}
			_, err := r.Route(t0, req(100), peers, nil)
			var nc *NoCandidateError
			if !errors.As(err, &nc) || !errors.Is(err, ErrNoCandidate) {
				t.Fatalf("err = %v, want *NoCandidateError wrapping ErrNoCandidate", err)
			}
			if nc.NoHost() != tt.noHost || nc.Busy() != tt.busy {
				t.Fatalf("NoHost=%v Busy=%v, want %v %v", nc.NoHost(), nc.Busy(), tt.noHost, tt.busy)
			}
			if !strings.Contains(err.Error(), tt.text) || !strings.HasPrefix(err.Error(), "route: ") {
				t.Fatalf("error %q lacks %q", err, tt.text)
			}
		})
	}
}

// A node without a waiting room routes to busy peers rather than refusing: the engine queues.
func TestKeepBusy(t *testing.T) {
	r := newRouter(t, nil)
	peers := idlePeers(3)
	peers[0].QueuedPrefillTokens = 1 << 20
	peers[1].Waiting, peers[2].Waiting = 50, 5
	rq := req(100)
	if _, err := r.Route(t0, rq, peers, nil); err == nil {
		t.Fatal("every peer is busy, want a NoCandidateError")
	}
	rq.KeepBusy = true
	got, err := r.Route(t0, rq, peers, nil)
	if err != nil || len(got) != 3 {
		t.Fatalf("KeepBusy: %d candidates, err %v; want all 3", len(got), err)
	}
	if got[0].Name != peers[2].Name {
		t.Errorf("KeepBusy ranks %s first, want the least loaded %s", got[0].Name, peers[2].Name)
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func nearDur(a, b time.Duration) bool { return (a - b).Abs() <= time.Microsecond }

func TestScoreTerms(t *testing.T) {
	loaded := func(p *Peer) {
		p.PrefixBlocks = 64
		p.QueuedPrefillTokens = 1000
		p.InFlightTokens = 3000
		p.KVBlocksUsed = 250
		p.PowerWatts = 350
		p.TempC = 85
	}
	tests := []struct {
		name    string
		mod     func(*Peer)
		prompt  int
		reserve [2]int
		weights Weights
		want    Terms
		score   float64
	}{
		{
			name: "all terms", mod: loaded, prompt: 2048, weights: DefaultConfig().Weights,
			want: Terms{PrefixTokens: 1024, PrefixSaved: 51200 * time.Microsecond, Prefix: 0.5, LoadTokens: 4000,
				Load: 4000.0 / 20384, FreeKV: 0.75, Power: 0.5, Thermal: 0.5},
			score: 0.5 - 0.5*4000.0/20384 + 0.25*0.75 + 0.1*0.5 - 0.5*0.5,
		},
		{
			name: "reservations count in load and kv", mod: loaded, prompt: 2048, reserve: [2]int{500, 50}, weights: DefaultConfig().Weights,
			want: Terms{PrefixTokens: 1024, PrefixSaved: 51200 * time.Microsecond, Prefix: 0.5, LoadTokens: 4500,
				Load: 4500.0 / 20884, FreeKV: 0.7, Power: 0.5, Thermal: 0.5, ReservedTokens: 500, ReservedBlocks: 50},
			score: 0.5 - 0.5*4500.0/20884 + 0.25*0.7 + 0.1*0.5 - 0.5*0.5,
		},
		{
			name: "prefix capped at prompt", mod: func(p *Peer) { p.PrefixBlocks = 1000 }, prompt: 100, weights: only(Weights{Prefix: 1}),
			want:  Terms{PrefixTokens: 100, PrefixSaved: 5 * time.Millisecond, Prefix: 1, FreeKV: 1, Power: 300.0/700*-1 + 1},
			score: 1,
		},
		{
			name: "unknown kv and power are neutral", mod: func(p *Peer) { p.KVBlocksTotal, p.PowerCapWatts = 0, 0 }, prompt: 10,
			weights: only(Weights{FreeKV: 1, Power: 1}),
			want:    Terms{FreeKV: 0.5, Power: 0.5}, score: 1,
		},
		{
			name: "load weight only", mod: func(p *Peer) { p.InFlightTokens = 16384 }, prompt: 10, weights: only(Weights{Load: 2}),
			want: Terms{LoadTokens: 16384, Load: 0.5, FreeKV: 1, Power: 1 - 300.0/700}, score: -1,
		},
		{
			name: "thermal weight only", mod: func(p *Peer) { p.TempC = 88 }, prompt: 10, weights: only(Weights{Thermal: 1}),
			want: Terms{FreeKV: 1, Power: 1 - 300.0/700, Thermal: 0.8}, score: -0.8,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRouter(t, func(c *Config) { c.Weights = tt.weights })
			p := idle("p")
			tt.mod(&p)
			if tt.reserve != [2]int{} {
				r.Reserve(t0, "p", tt.reserve[0], tt.reserve[1])
			}
			c := mustRoute(t, r, t0, req(tt.prompt), []Peer{p})[0]
			g, w := c.Terms, tt.want
			if g.PrefixTokens != w.PrefixTokens || !nearDur(g.PrefixSaved, w.PrefixSaved) || !near(g.Prefix, w.Prefix) ||
				g.LoadTokens != w.LoadTokens || !near(g.Load, w.Load) || !near(g.FreeKV, w.FreeKV) ||
				!near(g.Power, w.Power) || !near(g.Thermal, w.Thermal) ||
				g.ReservedTokens != w.ReservedTokens || g.ReservedBlocks != w.ReservedBlocks {
				t.Fatalf("terms\n got %+v\nwant %+v", g, w)
			}
			if !near(c.Score, tt.score) {
				t.Fatalf("score %v, want %v", c.Score, tt.score)
			}
		})
	}
}

func TestPredictedLatency(t *testing.T) {
	tests := []struct {
		name       string
		cfg        func(*Config)
		mod        func(*Peer)
		reserve    int // prefill tokens, one request
		ttft, tpot time.Duration
	}{
		{name: "idle, no prefix", mod: func(*Peer) {}, ttft: 2048*time.Second/20000 + 20*time.Millisecond, tpot: 20 * time.Millisecond},
		{name: "queue and prefix", mod: func(p *Peer) { p.QueuedPrefillTokens, p.PrefixBlocks, p.Running = 1000, 64, 4 },
			ttft: 2024*time.Second/20000 + 20*time.Millisecond, tpot: 22500 * time.Microsecond},
		{name: "reservation adds to queue and batch", mod: func(p *Peer) { p.QueuedPrefillTokens, p.PrefixBlocks, p.Running = 1000, 64, 4 },
			reserve: 500, ttft: 2524*time.Second/20000 + 20*time.Millisecond, tpot: 25 * time.Millisecond},
		{name: "batch capped at max running", mod: func(p *Peer) { p.Running, p.MaxRunning = 4, 4 },
			ttft: 2048*time.Second/20000 + 20*time.Millisecond, tpot: 20 * time.Millisecond},
		{name: "defaults for unreported rates", cfg: func(c *Config) { c.DefaultPrefillTokensPerSecond, c.DefaultDecodeStepSeconds = 10000, 0.05 },
			mod: func(p *Peer) { p.PrefillTokensPerSecond, p.DecodeStepSeconds = 0, 0 }, ttft: 2048*time.Second/10000 + 50*time.Millisecond, tpot: 50 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRouter(t, tt.cfg)
			p := idle("p")
			tt.mod(&p)
			if tt.reserve > 0 {
				r.Reserve(t0, "p", tt.reserve, 0)
			}
			c := mustRoute(t, r, t0, req(2048), []Peer{p})[0]
			if !nearDur(c.PredictedTTFT, tt.ttft) || !nearDur(c.PredictedTPOT, tt.tpot) {
				t.Fatalf("ttft=%v tpot=%v, want %v %v", c.PredictedTTFT, c.PredictedTPOT, tt.ttft, tt.tpot)
			}
		})
	}
}

// holder is a peer holding a 1536-token prefix of a 2048-token prompt with queued prefill.
func holder(queued int) Peer {
	p := idle("holder")
	p.PrefixBlocks = 96
	p.QueuedPrefillTokens = queued
	return p
}

func TestLoadGate(t *testing.T) {
	// Holder TTFT = (queued+512)/20000 + 20ms; others 122.4ms; slack = 76.8ms×factor (capped) + 25ms.
	tests := []struct {
		name      string
		cfg       func(*Config)
		queued    int
		wantFirst string
		gated     bool
	}{
		{name: "holder faster stays", queued: 1000, wantFirst: "holder"},
		{name: "holder slower within slack stays", queued: 3000, wantFirst: "holder"},
		{name: "holder slower beyond slack moves", queued: 6000, wantFirst: "other", gated: true},
		{name: "larger slack factor keeps it", cfg: func(c *Config) { c.GateSlackFactor = 100 }, queued: 6000, wantFirst: "holder"},
		{name: "max slack caps the factor", cfg: func(c *Config) { c.GateSlackFactor, c.GateMaxSlack = 100, 100*time.Millisecond },
			queued: 6000, wantFirst: "other", gated: true},
		{name: "no tolerance is strict", cfg: func(c *Config) { c.GateTolerance = -1 }, queued: 4000, wantFirst: "other", gated: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRouter(t, tt.cfg)
			cands := mustRoute(t, r, t0, req(2048), []Peer{holder(tt.queued), idle("other")})
			if cands[0].Name != tt.wantFirst || cands[0].Gated {
				t.Fatalf("first %v, want %s ungated", cands[0], tt.wantFirst)
			}
			h := cands[slices.IndexFunc(cands, func(c Candidate) bool { return c.Name == "holder" })]
			if h.Gated != tt.gated {
				t.Fatalf("holder gated=%v, want %v (%v)", h.Gated, tt.gated, h)
			}
		})
	}
	t.Run("a lone candidate is never gated", func(t *testing.T) {
		r := newRouter(t, nil)
		c := mustRoute(t, r, t0, req(2048), []Peer{holder(15000)})
		if c[0].Gated {
			t.Fatal("the only candidate was gated")
		}
	})
}

// TestRefused: an owner's refusal marks it busy for that priority and below until a record
// sent after the refusal arrives, or until the reservation TTL.
func TestRefused(t *testing.T) {
	cfg := DefaultConfig()
	type refused struct {
		at       time.Duration
		priority int
	}
	tests := []struct {
		name     string
		refusals []refused
		observe  time.Duration // a record of "a" received at t0 + observe (0: none)
		at       time.Duration // when the request is routed
		priority int
		busy     bool
	}{
		{"refused peer is busy", []refused{{0, 0}}, 0, time.Millisecond, 0, true},
		{"lower priority too", []refused{{0, 0}}, 0, time.Millisecond, -1, true},
		{"higher priority still goes", []refused{{0, 0}}, 0, time.Millisecond, 1, false},
		{"a later refusal of higher priority covers it", []refused{{0, 0}, {time.Millisecond, 1}}, 0, 2 * time.Millisecond, 1, true},
		{"a record sent before the refusal keeps it", []refused{{0, 0}}, cfg.ObserveMargin - time.Millisecond, cfg.ObserveMargin, 0, true},
		{"a record after the margin clears it", []refused{{0, 0}}, cfg.ObserveMargin, cfg.ObserveMargin, 0, false},
		{"ttl clears it", []refused{{0, 0}}, 0, cfg.ReservationTTL, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRouter(t, nil)
			for _, f := range tt.refusals {
				r.Refused(t0.Add(f.at), "a", f.priority)
			}
			if tt.observe > 0 {
				r.Observe("a", t0.Add(tt.observe))
			}
			rq := req(2048)
			rq.Priority = tt.priority
			cands := mustRoute(t, r, t0.Add(tt.at), rq, []Peer{idle("a"), idle("b")})
			if got := !slices.Contains(names(cands), "a"); got != tt.busy {
				t.Fatalf("a busy = %v, want %v (candidates %v)", got, tt.busy, names(cands))
			}
			if want := map[bool]int{true: 1}[tt.busy]; r.Counts()[ReasonBusy] != want {
				t.Fatalf("busy count %d, want %d", r.Counts()[ReasonBusy], want)
			}
		})
	}
}

func TestReservations(t *testing.T) {
	cfg := DefaultConfig()
	type step struct {
		op   string // reserve, observe, release, check
		at   time.Duration
		peer string
		n    int // reserve: tokens; release: index of the reservation; check: want tokens
		ok   bool
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"reservations add up", []step{
			{op: "reserve", peer: "a", n: 100}, {op: "reserve", at: time.Millisecond, peer: "a", n: 200},
			{op: "check", at: time.Millisecond, peer: "a", n: 300}, {op: "check", peer: "b", n: 0}}},
		{"record before the margin keeps them", []step{
			{op: "reserve", peer: "a", n: 100}, {op: "observe", at: cfg.ObserveMargin - time.Millisecond, peer: "a"},
			{op: "check", at: cfg.ObserveMargin, peer: "a", n: 100}}},
		{"record after the margin clears older ones only", []step{
			{op: "reserve", peer: "a", n: 100}, {op: "reserve", at: 150 * time.Millisecond, peer: "a", n: 7},
			{op: "observe", at: cfg.ObserveMargin, peer: "a"}, {op: "check", at: cfg.ObserveMargin, peer: "a", n: 7}}},
		{"record of another peer does nothing", []step{
			{op: "reserve", peer: "a", n: 100}, {op: "observe", at: time.Hour, peer: "b"}, {op: "check", peer: "a", n: 100}}},
		{"ttl expires", []step{
			{op: "reserve", peer: "a", n: 100}, {op: "check", at: cfg.ReservationTTL - time.Millisecond, peer: "a", n: 100},
			{op: "check", at: cfg.ReservationTTL, peer: "a", n: 0}}},
		{"release once", []step{
			{op: "reserve", peer: "a", n: 100}, {op: "reserve", peer: "a", n: 5},
			{op: "release", n: 0, ok: true}, {op: "release", n: 0, ok: false}, {op: "check", peer: "a", n: 5}}},
		{"release after observe is harmless", []step{
			{op: "reserve", peer: "a", n: 100}, {op: "observe", at: time.Second, peer: "a"},
			{op: "release", n: 0, ok: false}, {op: "check", at: time.Second, peer: "a", n: 0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRouter(t, nil)
			var rs []Reservation
			for i, s := range tt.steps {
				now := t0.Add(s.at)
				switch s.op {
				case "reserve":
					rs = append(rs, r.Reserve(now, s.peer, s.n, s.n/10))
				case "observe":
					r.Observe(s.peer, now)
				case "release":
					if got := r.Release(rs[s.n]); got != s.ok {
						t.Fatalf("step %d: Release = %v, want %v", i, got, s.ok)
					}
				case "check":
					tok, blocks, _ := r.Reserved(now, s.peer)
					if tok != s.n || blocks > tok {
						t.Fatalf("step %d: reserved %d tokens %d blocks, want %d tokens", i, tok, blocks, s.n)
					}
					if s.peer == "a" {
						c := mustRoute(t, r, now, req(10), []Peer{idle("a")})
						if c[0].Terms.ReservedTokens != s.n {
							t.Fatalf("step %d: Route saw %d reserved tokens, want %d", i, c[0].Terms.ReservedTokens, s.n)
						}
					}
				}
			}
		})
	}
	t.Run("per-peer bound drops the oldest", func(t *testing.T) {
		r := newRouter(t, func(c *Config) { c.MaxReservationsPerPeer = 2 })
		r.Reserve(t0, "a", 1, 0)
		r.Reserve(t0, "a", 10, 0)
		r.Reserve(t0, "a", 100, 0)
		if tok, _, n := r.Reserved(t0, "a"); tok != 110 || n != 2 {
			t.Fatalf("reserved %d tokens in %d, want 110 in 2", tok, n)
		}
	})
}

// TestQueuedAhead pins which queued prefill is ahead of a request: all of it on a first-come
// engine; on a priority engine only its class and above.
func TestQueuedAhead(t *testing.T) {
	p := Peer{QueuedPrefillTokens: 10000, QueuedBeforeHigh: 1000, QueuedLowWaiting: 6000}
	for _, tt := range []struct {
		prio     bool
		priority int
		want     int
	}{
		{false, 10, 10000}, {false, 0, 10000}, {false, -10, 10000},
		{true, 10, 1000}, {true, 0, 4000}, {true, -10, 10000},
	} {
		p.PriorityScheduling = tt.prio
		if got := QueuedAhead(&p, tt.priority); got != tt.want {
			t.Errorf("priority scheduling %v, priority %d: %d ahead, want %d", tt.prio, tt.priority, got, tt.want)
		}
	}
}

// TestCachedPrefixInTheRequestsTokens: blocks are cut in kvindex's tokens, so once a model's
// tokens are calibrated (TokenScale) a cached block holds that many more of the request's
// tokens, and the prediction deducts them.
func TestCachedPrefixInTheRequestsTokens(t *testing.T) {
	for _, tt := range []struct {
		scale  float64
		cached int
	}{{0, 1024}, {1, 1024}, {1.5, 1536}, {4, 4000}} {
		p := idle("p")
		p.PrefixBlocks = 64 // 1,024 kvindex tokens
		rq := req(4000)
		rq.TokenScale = tt.scale
		r := newRouter(t, nil)
		got := mustRoute(t, r, t0, rq, []Peer{p})[0]
		if got.Terms.PrefixTokens != tt.cached {
			t.Errorf("scale %v: %d cached tokens, want %d", tt.scale, got.Terms.PrefixTokens, tt.cached)
		}
	}
}
