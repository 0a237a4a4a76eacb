package attempt

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// show writes a step as the tables below spell it: its kind, its candidate's name, its flags.
func show(s Step, cands []Cand) string {
	var b strings.Builder
	b.WriteString(s.Kind.String())
	switch s.Kind {
	case RunLocal, Forward, RunPair, RunPrefill, RunDecode, Answered, Handed:
		b.WriteString(" " + cands[s.Cand].Name)
	}
	for _, f := range []struct {
		on   bool
		name string
	}{{s.Rerun, "rerun"}, {s.Budget, "budget"}, {s.Reserve, "reserve"}, {s.Stick, "stick"}} {
		if f.on {
			b.WriteString(" " + f.name)
		}
	}
	if s.Code != "" {
		b.WriteString(" " + s.Code)
	}
	if s.Wait != 0 {
		b.WriteString(" " + s.Wait.String())
	}
	return b.String()
}

// Results the tables feed the planners.
var (
	ran         = Result{Outcome: Ran}
	late        = Result{Outcome: Ran, Late: true}
	refused     = Result{Outcome: Refused}
	busy        = Result{Outcome: Refused, Reason: "engine_overloaded"} // an engine's own 429
	unreachable = Result{Outcome: Failed, Code: "owner_unreachable"}
	engine5xx   = Result{Outcome: Failed, Code: "engine_error"}
	gone        = Result{Outcome: ClientGone}
	spent       = Result{Outcome: BudgetSpent}
	paused      = Result{Outcome: Paused}
	handed      = Result{Outcome: HandedOver}
	broke       = Result{Outcome: Broke}
)

func isEnd(k Kind) bool {
	return k == Answered || k == Handed || k == Requeue || k == Fail || k == Gone || k == Migrate
}

// drive feeds results to a planner from its first step and returns the steps it took; it fails
// t when the planner ends before the results are spent or is still going after them.
func drive(t *testing.T, first Step, next func(Result) Step, cands func() []Cand, results []Result) []string {
	t.Helper()
	s := first
	steps := []string{show(s, cands())}
	for i, r := range results {
		if isEnd(s.Kind) {
			t.Fatalf("ended (%v) with %d results left: %q", steps, len(results)-i, steps)
		}
		s = next(r)
		steps = append(steps, show(s, cands()))
	}
	if !isEnd(s.Kind) {
		t.Fatalf("still going after every result: %q", steps)
	}
	return steps
}

// TestWhole pins the failover of one dispatch of a whole request: refusals move on and end in
// the waiting room, failures move on as retries the budget must allow and end the request.
func TestWhole(t *testing.T) {
	peers := []Cand{{Name: "a"}, {Name: "b"}, {Name: "c"}}
	withSelf := []Cand{{Name: "a"}, {Name: "self", Self: true}, {Name: "c"}}
	pair := []Cand{{Name: "p+d", Pair: true}, {Name: "a"}}
	tests := []struct {
		name     string
		cands    []Cand
		first    int
		attempts int
		f        Failures // before the dispatch
		results  []Result
		want     []string
		wantF    Failures // after it
	}{
		{"first owner runs it", peers, 0, 3, Failures{}, []Result{ran},
			[]string{"forward a", "answered a stick"}, Failures{}},
		{"owner refused: the next one, which takes the reservation", peers, 0, 3, Failures{}, []Result{refused, ran},
			[]string{"forward a", "forward b reserve", "answered b stick"}, Failures{}},
		{"engine 429 is a refusal", peers, 0, 3, Failures{}, []Result{busy, ran},
			[]string{"forward a", "forward b reserve", "answered b stick"}, Failures{}},
		{"every owner refused: back to the waiting room", peers, 0, 3, Failures{}, []Result{refused, refused, refused},
			[]string{"forward a", "forward b reserve", "forward c reserve", "requeue"}, Failures{}},
		{"owner unreachable: a retry the budget must allow", peers, 0, 3, Failures{}, []Result{unreachable, ran},
			[]string{"forward a", "forward b rerun budget reserve", "answered b stick"},
			Failures{N: 1, Code: "owner_unreachable", Owner: "a", Retrying: true}},
		{"engine 5xx before the first token: this node needs no budget", withSelf, 0, 3, Failures{}, []Result{engine5xx, ran},
			[]string{"forward a", "run_local self rerun reserve", "answered self stick"},
			Failures{N: 1, Code: "engine_error", Owner: "a", Retrying: true}},
		{"retry budget spent: the request ends with its failure", peers, 0, 3, Failures{}, []Result{unreachable, spent},
			[]string{"forward a", "forward b rerun budget reserve", "fail owner_unreachable"},
			Failures{N: 1, Code: "owner_unreachable", Owner: "a", Retrying: true}},
		{"every attempt failed: a 502, not the room", peers, 0, 3, Failures{}, []Result{unreachable, engine5xx, unreachable},
			[]string{"forward a", "forward b rerun budget reserve", "forward c rerun budget reserve", "fail owner_unreachable"},
			Failures{N: 3, Code: "owner_unreachable", Owner: "c", Retrying: true}},
		{"a refusal after a failure: the room may help", peers, 0, 3, Failures{}, []Result{unreachable, refused, refused},
			[]string{"forward a", "forward b rerun budget reserve", "forward c reserve", "requeue"},
			Failures{N: 1, Code: "owner_unreachable", Owner: "a"}},
		{"failures count over dispatches", peers, 1, 3, Failures{N: 2, Code: "engine_error", Owner: "x", Retrying: true},
			[]Result{unreachable},
			[]string{"forward b rerun budget", "fail owner_unreachable"},
			Failures{N: 3, Code: "owner_unreachable", Owner: "b", Retrying: true}},
		{"at most attempts candidates", peers, 0, 2, Failures{}, []Result{refused, refused},
			[]string{"forward a", "forward b reserve", "requeue"}, Failures{}},
		{"from the decision's choice on", peers, 2, 3, Failures{}, []Result{refused},
			[]string{"forward c", "requeue"}, Failures{}},
		{"client gone after an attempt", peers, 0, 3, Failures{}, []Result{gone},
			[]string{"forward a", "gone"}, Failures{}},
		{"an owner whose engine was late is no home", peers, 0, 3, Failures{}, []Result{late},
			[]string{"forward a", "answered a"}, Failures{}},
		{"this node is a home even when late", withSelf, 1, 3, Failures{}, []Result{late},
			[]string{"run_local self", "answered self stick"}, Failures{}},
		{"a peer home's pause is an answer, not a failure", peers, 0, 3, Failures{Retrying: true}, []Result{paused},
			[]string{"forward a rerun budget", "requeue"}, Failures{}},
		{"a pause heard with a failure keeps the retry", peers, 0, 3, Failures{Retrying: true},
			[]Result{{Outcome: Paused, Code: "owner_unreachable"}},
			[]string{"forward a rerun budget", "requeue"}, Failures{Retrying: true}},
		{"this node's pause keeps the retry", withSelf, 1, 3, Failures{Retrying: true}, []Result{paused},
			[]string{"run_local self rerun", "requeue"}, Failures{Retrying: true}},
		{"a pair answered: its decode node stuck on its own", pair, 0, 3, Failures{}, []Result{ran},
			[]string{"run_pair p+d", "answered p+d"}, Failures{}},
		{"a pair that failed falls back to whole candidates", pair, 0, 3, Failures{}, []Result{engine5xx, ran},
			[]string{"run_pair p+d", "forward a rerun budget reserve", "answered a stick"},
			Failures{N: 1, Code: "engine_error", Owner: "p+d", Retrying: true}},
		{"no candidate left", peers, 3, 3, Failures{}, nil, []string{"requeue"}, Failures{}},
		{"this node's engine died mid-response: the request migrates, and the node is no home", withSelf, 1, 3,
			Failures{}, []Result{broke}, []string{"run_local self", "migrate"}, Failures{}},
		{"this node's engine died before the first token: a retry on the next candidate", withSelf, 1, 3,
			Failures{}, []Result{engine5xx, ran}, []string{"run_local self", "forward c rerun budget reserve", "answered c stick"},
			Failures{N: 1, Code: "engine_error", Owner: "self", Retrying: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := tt.f
			d := &Whole{Cands: tt.cands, First: tt.first, Attempts: tt.attempts, F: &f}
			got := drive(t, d.Start(), d.Next, func() []Cand { return d.Cands }, tt.results)
			if !slices.Equal(got, tt.want) {
				t.Errorf("steps %q, want %q", got, tt.want)
			}
			if f != tt.wantF {
				t.Errorf("failures %+v, want %+v", f, tt.wantF)
			}
		})
	}
}

// TestPrefill pins the prefill half's failover: the pair's prefill node, then the search's
// others, retries after a failure only as the budget allows, and no handover as a refusal or
// the failure.
func TestPrefill(t *testing.T) {
	cands := []Cand{{Name: "p1"}, {Name: "p2"}, {Name: "p1"}, {Name: "self", Self: true}, {Name: "p3"}}
	tests := []struct {
		name     string
		attempts int
		results  []Result
		want     []string
		tries    int
	}{
		{"the pair's prefill node hands over", 3, []Result{handed}, []string{"run_prefill p1", "handed p1"}, 1},
		{"refused: the next prefill candidate, not the pair's twice", 3, []Result{refused, handed},
			[]string{"run_prefill p1", "run_prefill p2 rerun", "handed p2"}, 2},
		{"every prefill node refused: the room", 5, []Result{refused, refused, refused, refused},
			[]string{"run_prefill p1", "run_prefill p2 rerun", "run_prefill self rerun", "run_prefill p3 rerun", "requeue"}, 4},
		{"unreachable: a retry the budget allows, this node without it", 5, []Result{unreachable, refused, handed},
			[]string{"run_prefill p1", "run_prefill p2 rerun budget", "run_prefill self rerun", "handed self"}, 3},
		{"budget spent: that peer is skipped", 5, []Result{engine5xx, spent, refused, spent},
			[]string{"run_prefill p1", "run_prefill p2 rerun budget", "run_prefill self rerun", "run_prefill p3 rerun budget",
				"fail engine_error"}, 2},
		{"a failure ends the pair as that failure", 2, []Result{unreachable, refused},
			[]string{"run_prefill p1", "run_prefill p2 rerun budget", "fail owner_unreachable"}, 2},
		{"the request itself answered", 3, []Result{ran}, []string{"run_prefill p1", "answered p1"}, 0},
		{"client gone", 3, []Result{refused, gone}, []string{"run_prefill p1", "run_prefill p2 rerun", "gone"}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &Prefill{Cands: cands, Attempts: tt.attempts}
			got := drive(t, p.Start(), p.Next, func() []Cand { return p.Cands }, tt.results)
			if !slices.Equal(got, tt.want) {
				t.Errorf("steps %q, want %q", got, tt.want)
			}
			if p.Tries() != tt.tries {
				t.Errorf("tries %d, want %d", p.Tries(), tt.tries)
			}
		})
	}
}

// TestDecode pins the decode half: the pair's decode node, then the search's; every one
// refusing waits for decode room, offered to every decode node, until the deadline; a failure
// or a node of the wrong role ends it with its code.
func TestDecode(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(r Result, ms int) Result { r.Now = t0.Add(time.Duration(ms) * time.Millisecond); return r }
	wrong := Result{Outcome: Refused, Reason: CodeWrongRole}
	search := []Cand{{Name: "d1"}, {Name: "d2"}, {Name: "p"}, {Name: "d3"}}
	more := []Cand{{Name: "d9"}}
	tests := []struct {
		name    string
		pair    Cand
		results []Result // Widened is answered with more
		want    []string
		reason  string
	}{
		{"the pair's decode node takes it", Cand{Name: "d1"}, []Result{at(ran, 1)},
			[]string{"run_decode d1", "answered d1 stick"}, ""},
		{"late: no home", Cand{Name: "d1"}, []Result{at(late, 1)}, []string{"run_decode d1", "answered d1"}, ""},
		{"decode full: the next decode candidates, at most attempts, not the prefill node", Cand{Name: "d1"},
			[]Result{at(refused, 1), at(ran, 2)},
			[]string{"run_decode d1", "run_decode d2 rerun", "answered d2 stick"}, ""},
		{"every decode node full: the handover waits for room, offered to all", Cand{Name: "d1"},
			[]Result{at(busy, 1), at(busy, 2), at(busy, 3), {Outcome: Widened}, at(Result{Outcome: Waited}, 30),
				at(refused, 31), at(refused, 32), at(refused, 33), at(refused, 34), at(Result{Outcome: Waited}, 60), at(ran, 61)},
			[]string{"run_decode d1", "run_decode d2 rerun", "run_decode d3 rerun", "widen", "wait_decode_room 20ms",
				"run_decode d1 rerun", "run_decode d2 rerun", "run_decode d3 rerun", "run_decode d9 rerun", "wait_decode_room 20ms",
				"run_decode d1 rerun", "answered d1 stick"}, ""},
		{"no decode room until the deadline", Cand{Name: "d1"},
			[]Result{at(refused, 1), at(refused, 2), at(busy, 90)},
			[]string{"run_decode d1", "run_decode d2 rerun", "run_decode d3 rerun", "fail " + CodeDecodeUnavailable}, "engine_overloaded"},
		{"a failure stops the waiting", Cand{Name: "d1"},
			[]Result{at(unreachable, 1), at(refused, 2), at(refused, 3)},
			[]string{"run_decode d1", "run_decode d2 rerun", "run_decode d3 rerun", "fail " + CodeDecodeFailed}, ""},
		{"a failure in a later pass stops it at once", Cand{Name: "d1"},
			[]Result{at(refused, 1), at(refused, 2), at(refused, 3), {Outcome: Widened}, at(Result{Outcome: Waited}, 30),
				at(engine5xx, 31)},
			[]string{"run_decode d1", "run_decode d2 rerun", "run_decode d3 rerun", "widen", "wait_decode_room 20ms",
				"run_decode d1 rerun", "fail " + CodeDecodeFailed}, ""},
		{"every decode node of the wrong role", Cand{Name: "d1"},
			[]Result{at(wrong, 1), at(wrong, 2), at(wrong, 3), {Outcome: Widened}, at(Result{Outcome: Waited}, 30), at(wrong, 31)},
			[]string{"run_decode d1", "run_decode d2 rerun", "run_decode d3 rerun", "widen", "wait_decode_room 20ms",
				"run_decode d9 rerun", "fail " + CodeDecodeFailed}, CodeWrongRole},
		{"the pair's decode node prefilled: not offered", Cand{Name: "p"}, []Result{at(ran, 1)},
			[]string{"run_decode d1", "answered d1 stick"}, ""},
		{"the decode node's engine died mid-response: the request migrates", Cand{Name: "d1"},
			[]Result{at(refused, 1), broke},
			[]string{"run_decode d1", "run_decode d2 rerun", "migrate"}, ""},
		{"client gone while waiting", Cand{Name: "d1"},
			[]Result{at(refused, 1), at(refused, 2), at(refused, 3), {Outcome: Widened}, gone},
			[]string{"run_decode d1", "run_decode d2 rerun", "run_decode d3 rerun", "widen", "wait_decode_room 20ms", "gone"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDecode(tt.pair, search, "p", 3, t0.Add(100*time.Millisecond), 20*time.Millisecond)
			next := func(r Result) Step {
				if r.Outcome == Widened {
					d.Widen(more)
				}
				return d.Next(r)
			}
			got := drive(t, d.Start(t0), next, func() []Cand { return d.Cands }, tt.results)
			if !slices.Equal(got, tt.want) {
				t.Errorf("steps %q, want %q", got, tt.want)
			}
			if d.Reason() != tt.reason {
				t.Errorf("reason %q, want %q", d.Reason(), tt.reason)
			}
		})
	}
}

// TestMove pins what becomes of a request whose owner died after the first token.
func TestMove(t *testing.T) {
	for _, tt := range []struct {
		gone         bool
		moves, limit int
		want         Kind
	}{
		{false, 0, 1, Migrate}, {false, 1, 2, Migrate}, {false, 1, 1, Fail}, {false, 0, 0, Fail}, {true, 0, 1, Gone},
	} {
		if got := Move(tt.gone, tt.moves, tt.limit).Kind; got != tt.want {
			t.Errorf("Move(%v, %d, %d) = %v, want %v", tt.gone, tt.moves, tt.limit, got, tt.want)
		}
	}
}

// TestRenew pins the first-token deadline of a rerun: renewed once, only when passed.
func TestRenew(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ttl := 10 * time.Second
	for _, tt := range []struct {
		now, due    time.Time
		renewed     bool
		want        time.Time
		wantRenewed bool
	}{
		{t0, t0.Add(time.Second), false, t0.Add(time.Second), false},
		{t0, t0, false, t0.Add(ttl), true},
		{t0.Add(time.Second), t0, true, t0, true},
		{t0, time.Time{}, false, time.Time{}, false},
	} {
		got, renewed := Renew(tt.now, tt.due, ttl, tt.renewed)
		if !got.Equal(tt.want) || renewed != tt.wantRenewed {
			t.Errorf("Renew(%v, %v, %v) = %v %v, want %v %v", tt.now, tt.due, tt.renewed, got, renewed, tt.want, tt.wantRenewed)
		}
	}
}

func TestKindString(t *testing.T) {
	if s := fmt.Sprint(Migrate, Kind(99)); s != "migrate kind?" {
		t.Errorf("%q", s)
	}
}
