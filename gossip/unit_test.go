package gossip

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvmesh/kvmesh/kvindex"
)

func newUnit(t *testing.T, mod func(*Config)) *Gossip {
	t.Helper()
	c := testConfig("self")
	if mod != nil {
		mod(&c)
	}
	g, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func dropped(g *Gossip, reason string) float64 {
	return testutil.ToFloat64(g.met.dropped.WithLabelValues(reason))
}

// TestRestartByBootID pins the restart rule without a network: a new boot id drops the old
// residency and bumps the incarnation, and the old process's late messages are refused.
func TestRestartByBootID(t *testing.T) {
	g := newUnit(t, nil)
	now := time.Now()
	g.memberEvent(&memberlist.Node{Name: "p"}, LivenessAlive)
	blocks := []uint64{1, 2, 3}
	steps := []struct {
		name       string
		apply      func() (bool, string)
		wantReason string
		wantBlocks int
		wantInc    uint32
	}{
		{"first boot's record", func() (bool, string) { return g.applyState(State{Name: "p", BootID: 10, Seq: 5}, now) }, "", 0, 1},
		{"first boot's delta", func() (bool, string) {
			return g.applyDelta("p", 10, kvindex.Summary{Seq: 1, Added: blocks})
		}, "", 3, 1},
		{"restart with a lower seq", func() (bool, string) { return g.applyState(State{Name: "p", BootID: 11, Seq: 1}, now) }, "", 0, 2},
		{"late delta of the old boot", func() (bool, string) {
			return g.applyDelta("p", 10, kvindex.Summary{Seq: 2, Added: blocks})
		}, dropStaleBoot, 0, 2},
		{"new boot's delta", func() (bool, string) {
			return g.applyDelta("p", 11, kvindex.Summary{Seq: 1, Added: blocks[:1]})
		}, "", 1, 2},
		{"duplicate delta is not relayed", func() (bool, string) {
			return g.applyDelta("p", 11, kvindex.Summary{Seq: 1, Added: blocks})
		}, "", 1, 2},
	}
	for _, s := range steps {
		_, reason := s.apply()
		m, _ := member(g, "p")
		if reason != s.wantReason || g.idx.PeerBlocks("p") != s.wantBlocks || m.Incarnation != s.wantInc {
			t.Fatalf("%s: reason %q blocks %d incarnation %d; want %q %d %d", s.name, reason,
				g.idx.PeerBlocks("p"), m.Incarnation, s.wantReason, s.wantBlocks, s.wantInc)
		}
	}
	if relay, _ := g.applyDelta("p", 11, kvindex.Summary{Seq: 1}); relay {
		t.Fatal("duplicate delta relayed")
	}
	// A dead member's messages are refused and its residency gone.
	g.memberEvent(&memberlist.Node{Name: "p", State: memberlist.StateDead}, LivenessDead)
	if _, reason := g.applyDelta("p", 11, kvindex.Summary{Seq: 9, Added: blocks}); reason != dropDeadMember || g.idx.PeerBlocks("p") != 0 {
		t.Fatalf("dead member: reason %q, %d blocks", reason, g.idx.PeerBlocks("p"))
	}
}

func TestDeltaDedupOutOfOrder(t *testing.T) {
	var p peerInfo
	for _, tc := range []struct {
		seq  uint64
		want bool
	}{{3, true}, {1, true}, {2, true}, {3, false}, {1, false}, {70, true}, {6, false}, {69, true}, {69, false}} {
		if got := p.markSeen(tc.seq); got != tc.want {
			t.Fatalf("markSeen(%d) = %v, want %v", tc.seq, got, tc.want)
		}
	}
}

func TestBandwidthBound(t *testing.T) {
	g := newUnit(t, func(c *Config) { c.MaxBytesPerSecond = 8 << 10 })
	g.UpdateLocal(State{Models: []ModelInfo{{Name: "m"}}})
	g.alive.Store(16)
	for i := 0; i < 200; i++ {
		g.PrefixStored([]uint64{uint64(i)*1000 + 1, uint64(i)*1000 + 2})
		g.flush(time.Now())
	}
	if dropped(g, dropBandwidth) == 0 {
		t.Fatal("a backlog beyond two seconds of budget was not pruned")
	}
	q := g.domains["m"].queue
	if n := q.NumQueued(); n > max(16, 2*(8<<10)/maxMessage) {
		t.Fatalf("the domain queue holds %d messages", n)
	}
	start := time.Now()
	sent := 0
	for i := 0; i < 1000; i++ {
		// memberlist's gossip (state records) and the domain's share one budget.
		for _, m := range g.getBroadcasts(3, 1300) {
			sent += len(m) + 3
		}
		for _, m := range g.takeBroadcasts(q, 3, 1300) {
			sent += len(m) + 3
		}
	}
	budget := float64(8<<10) * (1 + time.Since(start).Seconds())
	if sent == 0 || float64(sent) > budget {
		t.Fatalf("sent %d bytes, budget %.0f", sent, budget)
	}
	if got := testutil.ToFloat64(g.met.sent); int(got) != sent {
		t.Fatalf("sent_bytes_total = %v, want %d", got, sent)
	}
}

func TestDeltaMessagesFitOnePacket(t *testing.T) {
	g := newUnit(t, nil)
	blocks := make([]uint64, 1000)
	for i := range blocks {
		blocks[i] = uint64(i + 1)
	}
	g.PrefixStored(blocks)
	g.PrefixEvicted(blocks[:10]) // coalesced: stored then evicted in one tick is an eviction
	g.mu.Lock()
	msgs := g.deltaMessagesLocked()
	g.mu.Unlock()
	var added, evicted int
	for _, b := range msgs {
		m := b.Message()
		if len(m) > maxMessage {
			t.Fatalf("delta of %d bytes", len(m))
		}
		_, _, s, err := decodeDelta(m[2:])
		if err != nil {
			t.Fatal(err)
		}
		added += len(s.Added)
		evicted += len(s.Evicted)
	}
	if added != 990 || evicted != 10 || len(msgs) < 8 {
		t.Fatalf("%d messages, %d added, %d evicted", len(msgs), added, evicted)
	}
}

func TestMetricsRegistered(t *testing.T) {
	reg := prometheus.NewRegistry()
	newUnit(t, func(c *Config) { c.Registerer = reg; c.StalePolicy = FailOpen })
	want := map[string]bool{
		"kvmesh_gossip_sent_bytes_total": true, "kvmesh_gossip_received_bytes_total": true,
		"kvmesh_gossip_dropped_messages_total": true, "kvmesh_gossip_stale_peers": true,
		"kvmesh_gossip_stale_policy": true, "kvmesh_gossip_index_bytes": true, "kvmesh_gossip_index_blocks": true,
		"kvmesh_gossip_domain_peers": true,
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		delete(want, mf.GetName())
		if mf.GetName() == "kvmesh_gossip_stale_policy" {
			for _, m := range mf.GetMetric() {
				if (m.GetLabel()[0].GetValue() == "open") != (m.GetGauge().GetValue() == 1) {
					t.Fatalf("stale_policy %v", m)
				}
			}
		}
	}
	if len(want) != 0 {
		t.Fatalf("missing metrics %v", want)
	}
	if _, err := New(func() Config { c := testConfig("dup"); c.Registerer = reg; return c }()); err == nil {
		t.Fatal("registering twice succeeded")
	}
}

// levelRecorder keeps the level of every record logged through it.
type levelRecorder struct{ levels *[]slog.Level }

func (r levelRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r levelRecorder) Handle(_ context.Context, rec slog.Record) error {
	*r.levels = append(*r.levels, rec.Level)
	return nil
}
func (r levelRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r levelRecorder) WithGroup(string) slog.Handler      { return r }

// TestMemberlistLogLevels: memberlist's lines keep their level, except its errors about its own
// sockets closing under it at shutdown, which say nothing failed.
func TestMemberlistLogLevels(t *testing.T) {
	var got []slog.Level
	w := logWriter{slog.New(levelRecorder{&got})}
	for _, line := range []string{
		"2026/12/04 16:11:36 [ERR] memberlist: Failed to send gossip to 127.0.0.1:1: write udp: i/o timeout",
		"2026/12/04 16:11:36 [ERR] memberlist: Failed to send indirect UDP ping: write udp 127.0.0.1:2->127.0.0.1:3: use of closed network connection",
		"2026/12/04 16:11:36 [WARN] memberlist: Was able to connect to n2 over TCP but UDP probes failed",
		"2026/12/04 16:11:36 [DEBUG] memberlist: Stream connection from=127.0.0.1:4",
	} {
		_, _ = w.Write([]byte(line + "\n"))
	}
	want := []slog.Level{slog.LevelError, slog.LevelDebug, slog.LevelWarn, slog.LevelDebug}
	if !slices.Equal(got, want) {
		t.Errorf("levels %v, want %v", got, want)
	}
}
