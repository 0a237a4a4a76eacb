package console

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestRingKeepsTheLastN pins the ring's bound: the newest entries first, the oldest gone, and
// at most MaxCandidates candidates kept, copied.
func TestRingKeepsTheLastN(t *testing.T) {
	r := NewRing(3)
	cands := make([]Candidate, MaxCandidates+2)
	for i := range 5 {
		cands[0].Name = fmt.Sprint("c", i)
		r.Add(Explanation{ID: fmt.Sprint(i), Candidates: cands})
	}
	cands[0].Name = "changed"
	rec := r.Recent(10)
	if len(rec) != 3 || rec[0].ID != "4" || rec[2].ID != "2" {
		t.Fatalf("recent %+v, want 4, 3, 2", rec)
	}
	if _, ok := r.Get("1"); ok {
		t.Fatal("an entry older than the ring's size is still there")
	}
	e, ok := r.Get("3")
	if !ok || len(e.Candidates) != MaxCandidates || e.Candidates[0].Name != "c3" {
		t.Fatalf("entry 3: %v %+v", ok, e)
	}
}

// TestFlowsAreBounded pins Flows' bound: past maxPeers named peers, the rest count as Other.
func TestFlowsAreBounded(t *testing.T) {
	f := NewFlows(2)
	for _, p := range []string{"a", "b", "c", "d", "a"} {
		f.Sent(p)
	}
	f.Received("e")
	s := f.Snapshot()
	if len(s) != 3 || s["a"].Sent != 2 || s[Other].Sent != 2 || s[Other].Received != 1 {
		t.Fatalf("flows %+v", s)
	}
}

// TestStateIsBuiltOncePerInterval pins the cost bound: a poll within the interval gets the
// last build, and the next interval builds again.
func TestStateIsBuiltOncePerInterval(t *testing.T) {
	now := time.Unix(0, 0)
	builds := 0
	c, err := New(Config{Node: "n", Peers: func() any { builds++; return builds }, Gatherer: prometheus.NewRegistry(),
		Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := c.State(); err != nil {
			t.Fatal(err)
		}
	}
	now = now.Add(time.Second)
	if _, err := c.State(); err != nil {
		t.Fatal(err)
	}
	if builds != 2 {
		t.Fatalf("%d builds, want 2", builds)
	}
	if _, err := New(Config{}); err == nil {
		t.Fatal("New without Peers and Gatherer: no error")
	}
}

// TestPageShowsEveryCandidateField pins the names the page reads against Candidate's JSON:
// a renamed or unread field would show as blank or zero in the explanation table.
func TestPageShowsEveryCandidateField(t *testing.T) {
	js, err := assets.ReadFile("assets/console.js")
	if err != nil {
		t.Fatal(err)
	}
	ct := reflect.TypeFor[Candidate]()
	for i := range ct.NumField() {
		name, _, _ := strings.Cut(ct.Field(i).Tag.Get("json"), ",")
		if !strings.Contains(string(js), "c."+name) {
			t.Errorf("the page does not read the candidate's %q (field %s)", name, ct.Field(i).Name)
		}
	}
}
