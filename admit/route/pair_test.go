package route

import (
	"slices"
	"testing"
	"time"
)

// rolePeer is an idle peer of role at the design doc's rates: 31,000 prefill tokens a second
// (8,000 tokens in 258 ms) and a 5 ms decode step.
func rolePeer(name, role string) Peer {
	p := idle(name)
	p.Role = role
	p.PrefillTokensPerSecond = 31000
	p.DecodeStepSeconds = 0.005
	return p
}

// choose runs what the planner runs for a request in a disaggregated mesh: the whole
// candidates, the pair's searches, the split rule.
func choose(t *testing.T, r *Router, rq Request, peers []Peer, tpotSLO time.Duration) (*Pair, bool, string) {
	t.Helper()
	pr, split, why, _ := chooseSLO(t, r, rq, peers, 0, tpotSLO)
	return pr, split, why
}

// chooseSLO is choose with a TTFT target too, and the pair's searches.
func chooseSLO(t *testing.T, r *Router, rq Request, peers []Peer, ttftSLO, tpotSLO time.Duration) (*Pair, bool, string, *PairSearch) {
	t.Helper()
	whole, _ := r.Route(t0, rq, peers, nil) // no whole candidate is an answer too
	var s PairSearch
	r.Pair(t0, rq, peers, tpotSLO, &s)
	pr, split, why := Choose(r.conf(), rq, whole, &s, ttftSLO, tpotSLO)
	return pr, split, why, &s
}

// TestSplitRule is the split rule's table (docs/design/disaggregation.md, "When to split"),
// with the design's example: an 8,000-token uncached prompt at 25 GB/s crosses in 42 ms
// against 258 ms of prefill; an idle mixed node predicts about 263 ms, an idle pair about 306
// ms; a mixed node with 16,384 tokens queued about 790 ms. Decode peers run halves only here
// (route.decode_local_prefill off): TestDecodeLocalPrefill has the rule with it on.
func TestSplitRule(t *testing.T) {
	loaded := rolePeer("m", "")
	loaded.QueuedPrefillTokens = 16384
	full := rolePeer("d", RoleDecode)
	full.KVBlocksUsed, full.DecodeStepSeconds = 990, 0.1 // still full when the half arrives
	slowStep := rolePeer("m", RoleMixed)
	slowStep.Running, slowStep.DecodeStepSeconds = 200, 0.3
	tests := []struct {
		name    string
		prompt  int
		link    float64
		peers   []Peer
		tpotSLO time.Duration
		split   bool
		why     string
		p, d    string
	}{
		{"short prompt runs whole", 1000, 0, []Peer{rolePeer("m", ""), rolePeer("p", RolePrefill), rolePeer("d", RoleDecode)},
			0, false, WholeShort, "p", "d"},
		{"slow link runs whole", 8000, 1.25, []Peer{rolePeer("m", ""), rolePeer("p", RolePrefill), rolePeer("d", RoleDecode)},
			0, false, WholeLink, "p", "d"},
		{"idle mixed runs whole", 8000, 0, []Peer{rolePeer("m", "mixed"), rolePeer("p", RolePrefill), rolePeer("d", RoleDecode)},
			0, false, WholeMixedFast, "p", "d"},
		{"loaded mixed splits", 8000, 0, []Peer{loaded, rolePeer("p", RolePrefill), rolePeer("d", RoleDecode)},
			0, true, SplitFaster, "p", "d"},
		{"mixed over its TPOT SLO splits", 8000, 0, []Peer{slowStep, rolePeer("p", RolePrefill), rolePeer("d", RoleDecode)},
			100 * time.Millisecond, true, SplitFaster, "p", "d"},
		{"no mixed node splits", 8000, 0, []Peer{rolePeer("p", RolePrefill), rolePeer("d", RoleDecode)},
			0, true, SplitNoMixed, "p", "d"},
		{"no mixed node splits a short prompt too", 100, 0, []Peer{rolePeer("p", RolePrefill), rolePeer("d", RoleDecode)},
			0, true, SplitNoMixed, "p", "d"},
		{"no pair runs whole", 8000, 0, []Peer{loaded, full}, 0, false, WholeNoPair, "", ""},
		{"a mixed node is either half", 8000, 0, []Peer{rolePeer("m", ""), rolePeer("d", RoleDecode)}, 0, false, WholeMixedFast, "m", "d"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRouter(t, func(c *Config) { c.LinkGBps, c.DecodeLocalPrefill = tt.link, new(bool) })
			pr, split, why := choose(t, r, req(tt.prompt), tt.peers, tt.tpotSLO)
			if split != tt.split || why != tt.why {
				t.Fatalf("split %v (%s), want %v (%s)", split, why, tt.split, tt.why)
			}
			if tt.p == "" {
				if pr != nil {
					t.Fatalf("pair %s→%s, want none", pr.Prefill.Name, pr.Decode.Name)
				}
				return
			}
			if pr == nil || pr.Prefill.Name != tt.p || pr.Decode.Name != tt.d {
				t.Fatalf("pair %+v, want %s→%s", pr, tt.p, tt.d)
			}
		})
	}
}

// TestDecodeLocalPrefill is the split rule's table for a decode peer running a request whole
// (route.decode_local_prefill, on by default), at the design example's rates: an idle decode
// node predicts 263 ms for an 8,000-token prompt, the pair about 306 ms with the prefill node
// idle and 834 ms with 16,384 tokens queued on it.
func TestDecodeLocalPrefill(t *testing.T) {
	queued := rolePeer("p", RolePrefill)
	queued.QueuedPrefillTokens = 16384
	full := rolePeer("p", RolePrefill)
	full.QueuedPrefillTokens = 40000 // busy for a prefill half
	batch := rolePeer("d", RoleDecode)
	batch.Running = 10 // TPOT 5.25 ms
	busyD := rolePeer("d", RoleDecode)
	busyD.QueuedPrefillTokens = 20000 // busy for a whole request, not for a decode half
	slowD := rolePeer("d1", RoleDecode)
	slowD.QueuedPrefillTokens = 8000 // 521 ms for the prompt whole
	slowM := rolePeer("m", RoleMixed)
	slowM.Running, slowM.DecodeStepSeconds, slowM.QueuedPrefillTokens = 200, 0.3, 16000
	halves := rolePeer("d", RoleDecode)
	halves.HalvesOnly = true // its own setting off
	pd := func(p, d Peer) []Peer { return []Peer{p, d} }
	const target = 500 * time.Millisecond
	tests := []struct {
		name       string
		prompt     int
		peers      []Peer
		ttft, tpot time.Duration
		off        bool
		split      bool
		why        string
		local      string // s.Local[0]; "": none
	}{
		{"a short prompt runs whole on the decode node", 1000, pd(rolePeer("p", RolePrefill), rolePeer("d", RoleDecode)), 0, 0, false, false, WholeDecodeShort, "d"},
		{"off: a short prompt is split", 1000, pd(rolePeer("p", RolePrefill), rolePeer("d", RoleDecode)), 0, 0, true, true, SplitNoMixed, ""},
		{"off on the decode node: a short prompt is split", 1000, pd(rolePeer("p", RolePrefill), halves), 0, 0, false, true, SplitNoMixed, ""},
		{"off on the decode node: no prefill node has room", 8000, pd(full, halves), target, 0, false, false, WholeNoPair, ""},
		{"the decode node whose own setting is on", 1000, []Peer{rolePeer("p", RolePrefill), halves, rolePeer("d2", RoleDecode)}, 0, 0, false, false, WholeDecodeShort, "d2"},
		{"the pair misses the target, the decode node meets it", 8000, pd(queued, rolePeer("d", RoleDecode)), target, 0, false, false, WholePrefillBehind, "d"},
		{"off: the pair misses the target, split", 8000, pd(queued, rolePeer("d", RoleDecode)), target, 0, true, true, SplitNoMixed, ""},
		{"the pair meets the target: split", 8000, pd(rolePeer("p", RolePrefill), rolePeer("d", RoleDecode)), target, 0, false, true, SplitNoMixed, "d"},
		{"both miss the target: split", 8000, pd(queued, rolePeer("d", RoleDecode)), 200 * time.Millisecond, 0, false, true, SplitNoMixed, "d"},
		{"the decode node misses its TPOT SLO: split", 8000, pd(queued, batch), target, 5100 * time.Microsecond, false, true, SplitNoMixed, "d"},
		{"a decode node busy for a whole request: split", 8000, pd(queued, busyD), target, 0, false, true, SplitNoMixed, ""},
		{"no target: the pair's queue costs more than the prefill", 8000, pd(queued, rolePeer("d", RoleDecode)), 0, 0, false, false, WholePrefillBehind, "d"},
		{"no target: an idle pair splits", 8000, pd(rolePeer("p", RolePrefill), rolePeer("d", RoleDecode)), 0, 0, false, true, SplitNoMixed, "d"},
		{"no prefill node has room: whole on the decode node", 8000, pd(full, rolePeer("d", RoleDecode)), target, 0, false, false, WholePrefillBehind, "d"},
		{"off: no prefill node has room", 8000, pd(full, rolePeer("d", RoleDecode)), target, 0, true, false, WholeNoPair, ""},
		{"the faster decode node", 8000, []Peer{queued, slowD, rolePeer("d2", RoleDecode)}, target, 0, false, false, WholePrefillBehind, "d2"},
		{"a short prompt prefers the mixed node", 1000, []Peer{rolePeer("m", ""), rolePeer("p", RolePrefill), rolePeer("d", RoleDecode)}, 0, 0, false, false, WholeShort, "d"},
		{"the prefill pool behind prefers an idle mixed node", 8000, []Peer{rolePeer("m", ""), queued, rolePeer("d", RoleDecode)}, target, 0, false, false, WholeMixedFast, "d"},
		{"a mixed node over its TPOT SLO leaves it to the decode node", 8000, []Peer{slowM, queued, rolePeer("d", RoleDecode)}, target, 100 * time.Millisecond, false, false, WholePrefillBehind, "d"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRouter(t, func(c *Config) {
				if tt.off {
					c.DecodeLocalPrefill = new(bool)
				}
			})
			_, split, why, s := chooseSLO(t, r, req(tt.prompt), tt.peers, tt.ttft, tt.tpot)
			if split != tt.split || why != tt.why {
				t.Errorf("split %v (%s), want %v (%s)", split, why, tt.split, tt.why)
			}
			switch {
			case tt.local == "" && len(s.Local) > 0:
				t.Errorf("local candidates %v, want none", names(s.Local))
			case tt.local != "" && (len(s.Local) == 0 || s.Local[0].Name != tt.local):
				t.Errorf("local candidates %v, want %s first", names(s.Local), tt.local)
			}
		})
	}
}

// TestSplitRuleNumbers pins the predictions of the design's example.
func TestSplitRuleNumbers(t *testing.T) {
	r := newRouter(t, nil)
	peers := []Peer{rolePeer("m", ""), rolePeer("p", RolePrefill), rolePeer("d", RoleDecode)}
	pr, _, _ := choose(t, r, req(8000), peers, 0)
	near := func(what string, got, want time.Duration) {
		t.Helper()
		if d := got - want; d < -2*time.Millisecond || d > 2*time.Millisecond {
			t.Errorf("%s = %v, want about %v", what, got, want)
		}
	}
	near("transfer", pr.Transfer, 42*time.Millisecond)
	near("pair TTFT", pr.TTFT, 306*time.Millisecond) // 258 + 1 + 42 + 5
	whole := mustRoute(t, r, t0, req(8000), peers)
	if len(whole) != 1 || whole[0].Name != "m" {
		t.Fatalf("whole candidates %v, want only the mixed node", whole)
	}
	near("mixed TTFT", whole[0].PredictedTTFT, 263*time.Millisecond)
	peers[0].QueuedPrefillTokens = 16384
	whole = mustRoute(t, r, t0, req(8000), peers)
	near("loaded mixed TTFT", whole[0].PredictedTTFT, 791*time.Millisecond)

	// The decode node's own queue: the handover waits behind what is left of it when the
	// prefill is done (16,384 tokens take 528 ms there, 269 more than the 259 of the prefill
	// and the hop); a queue that drains within the prefill adds nothing.
	peers[2].QueuedPrefillTokens = 16384
	pr, _, _ = choose(t, r, req(8000), peers, 0)
	near("pair TTFT behind the decode node's queue", pr.TTFT, 575*time.Millisecond) // 259 + 269 + 42 + 5
	peers[2].QueuedPrefillTokens = 4096
	pr, _, _ = choose(t, r, req(8000), peers, 0)
	near("pair TTFT behind a short queue", pr.TTFT, 306*time.Millisecond)
}

// TestPairSearch pins the two searches: roles, the busy tests of each half, and the orders.
func TestPairSearch(t *testing.T) {
	r := newRouter(t, nil)
	prefixed := rolePeer("p2", RolePrefill)
	prefixed.PrefixBlocks = 250 // 4,000 of the 8,000 tokens
	queued := rolePeer("p3", RolePrefill)
	queued.QueuedPrefillTokens = 40000 // busy (a prefill node at 32,768)
	halfFull := rolePeer("d2", RoleDecode)
	halfFull.KVBlocksUsed = 300
	noSeat := rolePeer("d3", RoleDecode)
	noSeat.Running = 256
	bigPrompt := rolePeer("d4", RoleDecode)
	bigPrompt.KVBlocksUsed = 450      // 450 + 508 blocks of prompt and output > 95% of 1000
	bigPrompt.DecodeStepSeconds = 0.1 // its residence of 128 steps outlasts the prefill
	drains := rolePeer("d6", RoleDecode)
	drains.KVBlocksUsed = 500 // busy now (500 + 508 > 950), a quarter released by the arrival (anti-phase)
	batch := rolePeer("d5", RoleDecode)
	batch.Running = 10
	peers := []Peer{rolePeer("p1", RolePrefill), prefixed, queued, rolePeer("d1", RoleDecode), halfFull, noSeat, bigPrompt, batch, drains, rolePeer("m", "")}
	var s PairSearch
	r.Pair(t0, req(8000), peers, 0, &s)
	names := func(cs []Candidate) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.Name)
		}
		return out
	}
	if got, want := names(s.Prefill), []string{"p2", "p1", "m"}; !equalStrings(got, want) {
		t.Errorf("prefill candidates %v, want %v (the prefix first, dedicated before mixed; the queue busy)", got, want)
	}
	if got, want := names(s.Decode), []string{"d1", "m", "d2", "d6", "d5"}; !equalStrings(got, want) {
		t.Errorf("decode candidates %v, want %v (by TPOT, then free KV, dedicated before mixed; no seat and no room at the arrival busy)", got, want)
	}
	if !s.Busy {
		t.Error("Busy = false with busy peers of both roles")
	}
	// Under a TPOT SLO that only the small batches meet, the batch of 10 goes last whatever
	// its free KV.
	r.Pair(t0, req(8000), peers, 5*time.Millisecond+100*time.Microsecond, &s)
	if got := names(s.Decode); got[len(got)-1] != "d5" {
		t.Errorf("decode candidates %v under a tight TPOT SLO, want d5 last", got)
	}
	// A whole request never lands on a prefill or decode peer.
	whole := mustRoute(t, r, t0, req(8000), peers)
	if got := names(whole); !equalStrings(got, []string{"m"}) {
		t.Errorf("whole candidates %v, want only the mixed node", got)
	}
	if Disaggregated(idlePeers(3)) || !Disaggregated(peers) {
		t.Error("Disaggregated wrong")
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestHoldOutlivesRecords pins a split request's decode hold: the decode node's records do not
// clear it (the half reaches that node only with the handover), Release does, and HeldTTL
// bounds one never released.
func TestHoldOutlivesRecords(t *testing.T) {
	r := newRouter(t, nil)
	h := r.Hold(t0, "d", 40)
	r.Reserve(t0, "d", 0, 2)
	r.Observe("d", t0.Add(time.Second))
	if _, blocks, _ := r.Reserved(t0.Add(time.Second), "d"); blocks != 40 {
		t.Fatalf("after a record: %d blocks reserved, want the hold's 40", blocks)
	}
	if _, blocks, _ := r.Reserved(t0.Add(HeldTTL), "d"); blocks != 0 {
		t.Errorf("past HeldTTL: %d blocks", blocks)
	}
	h = r.Hold(t0, "d", 40)
	if !r.Release(h) {
		t.Error("Release of a hold")
	}
	if _, blocks, _ := r.Reserved(t0, "d"); blocks != 0 {
		t.Errorf("after Release: %d blocks", blocks)
	}
}

// TestPrefillBusyThreshold pins the prefill pool's busy threshold: a prefill node is busy for
// the prefill half past route.prefill_busy_queued_prefill_tokens, a mixed node past
// route.busy_queued_prefill_tokens.
func TestPrefillBusyThreshold(t *testing.T) {
	r := newRouter(t, nil)
	pre, mix := rolePeer("p", RolePrefill), rolePeer("m", RoleMixed)
	pre.QueuedPrefillTokens, mix.QueuedPrefillTokens = 20000, 20000
	var s PairSearch
	r.Pair(t0, req(8000), []Peer{pre, mix, rolePeer("d", RoleDecode)}, 0, &s)
	if got := names(s.Prefill); !equalStrings(got, []string{"p"}) {
		t.Errorf("20,000 queued: prefill candidates %v, want [p] (the mixed node busy)", got)
	}
	pre.QueuedPrefillTokens = 40000
	r.Pair(t0, req(8000), []Peer{pre, mix, rolePeer("d", RoleDecode)}, 0, &s)
	if len(s.Prefill) != 0 || !s.Busy {
		t.Errorf("40,000 queued: prefill candidates %v busy %v, want none, busy", names(s.Prefill), s.Busy)
	}
}

// TestFullDecodePeersStayCandidates pins that decode peers short of KV remain the decode
// candidates when no other is left (admission then refuses or queues the request naming its
// decode room), while a peer with no seat never is.
func TestFullDecodePeersStayCandidates(t *testing.T) {
	r := newRouter(t, nil)
	full, noSeat := rolePeer("d1", RoleDecode), rolePeer("d2", RoleDecode)
	full.KVBlocksUsed, full.DecodeStepSeconds = 990, 0.1
	noSeat.Running = 256
	var s PairSearch
	r.Pair(t0, req(8000), []Peer{rolePeer("p", RolePrefill), full, noSeat}, 0, &s)
	if got := names(s.Decode); !equalStrings(got, []string{"d1"}) || !s.Busy {
		t.Errorf("decode candidates %v busy %v, want [d1], busy", got, s.Busy)
	}
	r.Pair(t0, req(8000), []Peer{rolePeer("p", RolePrefill), full, rolePeer("d3", RoleDecode)}, 0, &s)
	if got := names(s.Decode); !equalStrings(got, []string{"d3"}) {
		t.Errorf("with a roomy decode peer: %v, want [d3]", got)
	}
}

// TestLocalCandidatesFiltered pins that a decode peer runs a request whole (PairSearch.Local)
// only through the filters a whole candidate passes: route.roles, the power cap (while another
// decode peer is under its cap), health, staleness, ejection, the thermal limit, the vendor.
// route.roles without decode leaves it a candidate for the decode half, which it names no
// role for.
func TestLocalCandidatesFiltered(t *testing.T) {
	atCap := func(p *Peer) { p.PowerWatts = p.PowerCapWatts }
	tests := []struct {
		name   string
		conf   func(*Config)
		d1     func(*Peer)
		alone  bool // d1 the only decode peer
		local  []string
		decode bool // d1 among the decode candidates
	}{
		{"both pass", nil, nil, false, []string{"d1", "d2"}, true},
		{"at its power cap, another under it", nil, atCap, false, []string{"d2"}, false},
		{"at its power cap, alone", nil, atCap, true, []string{"d1"}, true},
		{"at its power cap, the filter off", func(c *Config) { c.DisablePowerCapFilter = true }, atCap, false, []string{"d1", "d2"}, true},
		{"route.roles without decode", func(c *Config) { c.Roles = []string{RoleMixed} }, nil, false, nil, true},
		{"route.roles with decode", func(c *Config) { c.Roles = []string{RoleMixed, RoleDecode} }, nil, false, []string{"d1", "d2"}, true},
		{"unhealthy", nil, func(p *Peer) { p.Healthy = false }, false, []string{"d2"}, false},
		{"stale", nil, func(p *Peer) { p.Stale = true }, false, []string{"d2"}, false},
		{"ejected", nil, func(p *Peer) { p.Ejected = true }, false, []string{"d2"}, false},
		{"too hot", nil, func(p *Peer) { p.TempC = 95 }, false, []string{"d2"}, false},
		{"another vendor's", func(c *Config) { c.ModelVendors = map[string][]string{"m": {"nvidia"}} }, func(p *Peer) { p.Vendor = "amd" },
			false, []string{"d2"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRouter(t, tt.conf)
			d1 := rolePeer("d1", RoleDecode)
			if tt.d1 != nil {
				tt.d1(&d1)
			}
			peers := []Peer{rolePeer("p", RolePrefill), d1}
			if !tt.alone {
				peers = append(peers, rolePeer("d2", RoleDecode))
			}
			var s PairSearch
			r.Pair(t0, req(1000), peers, 0, &s)
			if got := names(s.Local); !equalStrings(got, tt.local) {
				t.Errorf("local candidates %v, want %v", got, tt.local)
			}
			if got := slices.Contains(names(s.Decode), "d1"); got != tt.decode {
				t.Errorf("decode candidates %v: d1 among them %v, want %v", names(s.Decode), got, tt.decode)
			}
		})
	}
}

// TestPairSearchFilters pins that the pair's searches run routing's filters as Route does
// (filter, then the power cap and the thermal limit): a mixed peer is a half only when
// route.roles lets it run whole requests, and a peer at its power cap is passed over for a
// half while another of that half is under its cap, as for a whole request.
func TestPairSearchFilters(t *testing.T) {
	atCap := func(p *Peer) { p.PowerWatts = p.PowerCapWatts }
	hot := func(p *Peer) { p.TempC = 95 }
	tests := []struct {
		name            string
		conf            func(*Config)
		peers           []Peer
		mod             map[string]func(*Peer)
		prefill, decode []string
	}{
		{"all pass", nil, []Peer{rolePeer("p1", RolePrefill), rolePeer("m", RoleMixed), rolePeer("d1", RoleDecode)}, nil,
			[]string{"p1", "m"}, []string{"d1", "m"}},
		{"route.roles without mixed", func(c *Config) { c.Roles = []string{"gpu"} },
			[]Peer{rolePeer("p1", RolePrefill), rolePeer("m", RoleMixed), rolePeer("d1", RoleDecode)}, nil,
			[]string{"p1"}, []string{"d1"}},
		{"route.roles with mixed", func(c *Config) { c.Roles = []string{RoleMixed} },
			[]Peer{rolePeer("p1", RolePrefill), rolePeer("m", ""), rolePeer("d1", RoleDecode)}, nil,
			[]string{"p1", "m"}, []string{"d1", "m"}},
		{"a prefill peer at its power cap, another under it", nil,
			[]Peer{rolePeer("p1", RolePrefill), rolePeer("p2", RolePrefill), rolePeer("d1", RoleDecode)},
			map[string]func(*Peer){"p1": atCap}, []string{"p2"}, []string{"d1"}},
		{"a decode peer at its power cap, another under it", nil,
			[]Peer{rolePeer("p1", RolePrefill), rolePeer("d1", RoleDecode), rolePeer("d2", RoleDecode)},
			map[string]func(*Peer){"d1": atCap}, []string{"p1"}, []string{"d2"}},
		{"every peer of a half at its power cap", nil,
			[]Peer{rolePeer("p1", RolePrefill), rolePeer("d1", RoleDecode)},
			map[string]func(*Peer){"p1": atCap, "d1": atCap}, []string{"p1"}, []string{"d1"}},
		{"at its power cap, the filter off", func(c *Config) { c.DisablePowerCapFilter = true },
			[]Peer{rolePeer("p1", RolePrefill), rolePeer("p2", RolePrefill), rolePeer("d1", RoleDecode), rolePeer("d2", RoleDecode)},
			map[string]func(*Peer){"p1": atCap, "d1": atCap}, []string{"p1", "p2"}, []string{"d1", "d2"}},
		{"too hot", nil, []Peer{rolePeer("p1", RolePrefill), rolePeer("d1", RoleDecode), rolePeer("d2", RoleDecode)},
			map[string]func(*Peer){"p1": hot, "d1": hot}, nil, []string{"d2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRouter(t, tt.conf)
			peers := slices.Clone(tt.peers)
			for i := range peers {
				if f := tt.mod[peers[i].Name]; f != nil {
					f(&peers[i])
				}
			}
			var s PairSearch
			r.Pair(t0, req(8000), peers, 0, &s)
			pre, dec := names(s.Prefill), names(s.Decode)
			slices.Sort(pre)
			slices.Sort(dec)
			want := func(w []string) []string { w = slices.Clone(w); slices.Sort(w); return w }
			if !equalStrings(pre, want(tt.prefill)) || !equalStrings(dec, want(tt.decode)) {
				t.Errorf("prefill %v decode %v, want %v and %v", pre, dec, tt.prefill, tt.decode)
			}
		})
	}
}
