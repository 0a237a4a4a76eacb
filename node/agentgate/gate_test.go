package agentgate

import (
	"context"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/admit/agent"
)

// newGate returns a gate whose window holds one agent.
func newGate(t *testing.T) *Gate {
	t.Helper()
	cfg := agent.DefaultConfig()
	cfg.Controller.InitialWindow, cfg.Controller.MaxWindow = 1, 1
	reg, err := agent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	home, err := agent.NewHome(agent.HomeConfig{Name: "h", Interval: 100 * time.Millisecond, LeaseIntervals: 5}, reg)
	if err != nil {
		t.Fatal(err)
	}
	return New(home, nil)
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestGateParksAndWakesALocalStep: with the one slot taken, a local step of another agent is
// parked (a peer's is not), and the first agent's last step wakes it.
func TestGateParksAndWakesALocalStep(t *testing.T) {
	g, now := newGate(t), time.Now()
	stepA, stepB, stepC := new(int), new(int), new(int)
	if run, err := g.Arrive(now, stepA, "a", 100, true); !run || err != nil {
		t.Fatalf("a: run %v err %v, want to run", run, err)
	}
	if run, _ := g.Arrive(now, stepB, "b", 100, true); run {
		t.Fatal("b ran while a holds the only slot")
	}
	if run, _ := g.Arrive(now, stepC, "c", 100, false); run {
		t.Fatal("c ran while a holds the only slot")
	}
	id, wake, ok := g.Parked(stepB)
	if !ok || id != "b" || closed(wake) {
		t.Fatalf("b: parked %v as %q, woken %v", ok, id, closed(wake))
	}
	if _, _, ok := g.Parked(stepC); ok {
		t.Fatal("a peer's step is parked here: its ingress keeps it")
	}
	g.Observe(stepA, "a", 0, 100, 10)
	g.Ran(now, stepA, "a", true, true, nil)
	g.Tick(now.Add(100*time.Millisecond), agent.Engine{KVBlocksTotal: 1000, KVBlocksUsed: 10, BlockTokens: 16}, nil)
	if !closed(wake) || !g.MayRun("b") {
		t.Fatalf("b not let in after a's last step: woken %v", closed(wake))
	}
}

// TestGateStopEndsWaits: Stop ends a Pause and a renewal's wait at once.
func TestGateStopEndsWaits(t *testing.T) {
	g, now := newGate(t), time.Now()
	if run, _ := g.Arrive(now, new(int), "a", 100, true); !run {
		t.Fatal("a did not run")
	}
	if run, _ := g.Arrive(now, nil, "b", 100, false); run {
		t.Fatal("b ran while a holds the only slot")
	}
	g.Stop()
	if !g.Stopped() {
		t.Fatal("not stopped")
	}
	g.Pause(context.Background(), nil, time.Hour)
	if st := g.RenewWait(context.Background(), now, "b", time.Hour); st != agent.Waiting {
		t.Fatalf("b: %v, want waiting", st)
	}
}

// TestParseState: every state a home answers parses back; anything else is Absent.
func TestParseState(t *testing.T) {
	for _, st := range []agent.State{agent.Waiting, agent.Active, agent.Paused, agent.Absent} {
		if got := ParseState(st.String()); got != st {
			t.Errorf("%v parsed as %v", st, got)
		}
	}
	if got := ParseState("bogus"); got != agent.Absent {
		t.Errorf("bogus parsed as %v", got)
	}
}
