package gossip

import (
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvmesh/kvmesh/internal/poll"
)

// joinFailing is the node's kvmesh_gossip_join_failing.
func joinFailing(g *Gossip) float64 { return testutil.ToFloat64(g.met.joinFailing) }

// TestJoinFailingIsReported: a node whose seeds it cannot join serves alone and says so
// (JoinFailing, kvmesh_gossip_join_failing) while it is alone: with another mesh's key, with
// its seed down; not with the right key, not without seeds, and no longer once a peer joins it.
func TestJoinFailingIsReported(t *testing.T) {
	seed := startCluster(t, 1, nil)[0]
	if err := seed.JoinFailing(); err != nil || joinFailing(seed) != 0 {
		t.Errorf("a node without seeds: JoinFailing %v, gauge %v; want nil and 0", err, joinFailing(seed))
	}

	c := testConfig("wrong-key")
	c.Join = []string{seed.LocalAddr()}
	c.Key = []byte("fedcba9876543210fedcba9876543210")
	bad := startNode(t, c)
	if err := bad.JoinFailing(); err == nil || joinFailing(bad) != 1 {
		t.Errorf("a node with another key: JoinFailing %v, gauge %v; want an error and 1", err, joinFailing(bad))
	}

	c = testConfig("right-key")
	c.Join = []string{seed.LocalAddr()}
	good := startNode(t, c)
	if err := good.JoinFailing(); err != nil || joinFailing(good) != 0 {
		t.Errorf("a node that joined: JoinFailing %v, gauge %v; want nil and 0", err, joinFailing(good))
	}

	c = testConfig("lonely")
	c.Join = []string{deadSeed(t)}
	lonely := startNode(t, c)
	if err := lonely.JoinFailing(); err == nil || joinFailing(lonely) != 1 {
		t.Fatalf("a node with its seed down: JoinFailing %v, gauge %v; want an error and 1", err, joinFailing(lonely))
	}
	c = testConfig("visitor")
	c.Join = []string{lonely.LocalAddr()}
	startNode(t, c)
	poll.Until(t, 10*time.Second, "a peer's join to end the failing join", func() bool {
		return lonely.JoinFailing() == nil && joinFailing(lonely) == 0
	})
}

// deadSeed is a loopback TCP address nobody listens on.
func deadSeed(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// TestJoinFailureLogIsBounded: failed joins log a WARN at the first failure and then at most
// one a joinWarnEvery, however often the node retries; a failure after a success warns again.
func TestJoinFailureLogIsBounded(t *testing.T) {
	rec := newLogRecorder()
	c := testConfig("n")
	c.Logger = slog.New(rec)
	g, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	fail := errors.New("no installed keys could decrypt the message")
	t0 := time.Unix(1000, 0)
	for _, step := range []struct {
		at   time.Duration
		err  error
		warn bool
	}{
		{0, fail, true},
		{100 * time.Millisecond, fail, false},
		{30 * time.Second, fail, false},
		{joinWarnEvery, fail, true},
		{joinWarnEvery + time.Second, fail, false},
		{joinWarnEvery + 2*time.Second, nil, false},
		{joinWarnEvery + 3*time.Second, fail, true},
	} {
		before := len(rec.all())
		g.noteJoin(t0.Add(step.at), step.err)
		after := rec.all()
		warned := len(after) > before && after[len(after)-1].level == slog.LevelWarn
		if warned != step.warn {
			t.Errorf("at +%v (err %v): warned %v, want %v", step.at, step.err, warned, step.warn)
		}
	}
}
