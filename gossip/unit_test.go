package gossip

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
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
	g, err := newGossip(c, &recorder{sent: map[string][][]byte{}})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// recorder is a directSender that keeps what g's prefix rounds send, by member, and sends
// nothing.
type recorder struct{ sent map[string][][]byte }

func (r *recorder) SendToAddress(a memberlist.Address, msg []byte) error {
	r.sent[a.Name] = append(r.sent[a.Name], msg)
	return nil
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
		{"duplicate delta is not applied again", func() (bool, string) {
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
	if applied, _ := g.applyDelta("p", 11, kvindex.Summary{Seq: 1}); applied {
		t.Fatal("duplicate delta applied")
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

// unitDomain makes g serve model m with peers p1..pn serving it too, and returns what g's
// prefix rounds send, by member (its recorder).
func unitDomain(t *testing.T, g *Gossip, n int) map[string][][]byte {
	t.Helper()
	g.UpdateLocal(State{Models: []ModelInfo{{Name: "m"}}})
	g.flush(time.Now())
	for i := 1; i <= n; i++ {
		name := fmt.Sprintf("p%d", i)
		g.memberEvent(&memberlist.Node{Name: name, Addr: net.IPv4(127, 0, 0, 1), Port: uint16(i)}, LivenessAlive)
		if _, reason := g.applyState(State{Name: name, BootID: uint64(100 + i), Seq: 1, Models: []ModelInfo{{Name: "m"}}}, time.Now()); reason != "" {
			t.Fatal(reason)
		}
	}
	return g.direct.(*recorder).sent
}

func decodeAll(t *testing.T, msgs [][]byte) (added, evicted []uint64) {
	t.Helper()
	for _, m := range msgs {
		if m[1] != msgDelta {
			continue // a record
		}
		_, _, s, err := decodeDelta(m[2:])
		if err != nil {
			t.Fatal(err)
		}
		added = append(added, s.Added...)
		evicted = append(evicted, s.Evicted...)
	}
	return added, evicted
}

// TestPrefixRoundsSendEachMemberItsDeltasOnce pins the direct rule: a round sends every
// domain member the coalesced deltas once, a new member first the whole residency, and the
// next round only what changed since.
func TestPrefixRoundsSendEachMemberItsDeltasOnce(t *testing.T) {
	g := newUnit(t, nil)
	g.PrefixStored([]uint64{1, 2, 3})
	sent := unitDomain(t, g, 2)
	now := time.Now()
	g.sendPrefixes(now)
	for _, p := range []string{"p1", "p2"} {
		added, evicted := decodeAll(t, sent[p])
		// The pending deltas, then the residency for a member not yet synced.
		if !slices.Equal(added, []uint64{1, 2, 3, 1, 2, 3}) || len(evicted) != 0 {
			t.Fatalf("%s got added %v evicted %v", p, added, evicted)
		}
	}
	clear(sent)
	g.PrefixStored([]uint64{4})
	g.PrefixEvicted([]uint64{1})
	g.PrefixStored([]uint64{5})
	g.PrefixEvicted([]uint64{5}) // stored and evicted within a round: an eviction
	g.sendPrefixes(now.Add(time.Second))
	for _, p := range []string{"p1", "p2"} {
		added, evicted := decodeAll(t, sent[p])
		if !slices.Equal(added, []uint64{4}) || !slices.Equal(evicted, []uint64{1, 5}) {
			t.Fatalf("%s got added %v evicted %v", p, added, evicted)
		}
	}
	clear(sent)
	// A restarted member (new boot id) is sent the residency again; the other is not.
	if _, reason := g.applyState(State{Name: "p2", BootID: 999, Seq: 1, Models: []ModelInfo{{Name: "m"}}}, now); reason != "" {
		t.Fatal(reason)
	}
	g.sendPrefixes(now.Add(2 * time.Second))
	if added, _ := decodeAll(t, sent["p2"]); !slices.Equal(added, []uint64{2, 3, 4}) || len(sent["p1"]) != 0 {
		t.Fatalf("p2 got %v, p1 %d messages", added, len(sent["p1"]))
	}
}

// TestRoundLargerThanTheBucket pins the overdraft: a round to a domain so large that one
// delta to every member costs more than the bucket holds is still sent, whole, and the next
// round waits until the bucket is back above zero.
func TestRoundLargerThanTheBucket(t *testing.T) {
	const budget = 16 << 10
	g := newUnit(t, func(c *Config) { c.MaxBytesPerSecond = budget })
	sent := unitDomain(t, g, 400)
	now := time.Now()
	g.sendPrefixes(now) // syncs the (empty) residency
	g.PrefixStored([]uint64{7})
	g.sendPrefixes(now.Add(time.Second))
	if len(sent) != 400 || 400*bytesOf(sent["p1"]) <= budget {
		t.Fatalf("%d members sent to, %d bytes each: want all 400, more than the bucket in all", len(sent), bytesOf(sent["p1"]))
	}
	clear(sent)
	g.PrefixStored([]uint64{8})
	g.sendPrefixes(now.Add(time.Second + 100*time.Millisecond))
	for name, msgs := range sent { // records may go (they go whatever the debt); deltas wait
		if added, _ := decodeAll(t, msgs); len(added) != 0 {
			t.Fatalf("%s was sent deltas %v while the bucket was in debt", name, added)
		}
	}
	g.sendPrefixes(now.Add(3 * time.Second))
	if added, _ := decodeAll(t, sent["p400"]); !slices.Equal(added, []uint64{8}) {
		t.Fatalf("once the bucket refilled, p400 got %v", added)
	}
}

// TestBandwidthBound pins the budget: prefix rounds and state records together send no more
// than MaxBytesPerSecond (plus the bucket's one second), deltas wait for it, and a backlog
// past two seconds of it is dropped, counted, and replaced by a resync of the residency.
func TestBandwidthBound(t *testing.T) {
	const budget = 8 << 10
	g := newUnit(t, func(c *Config) { c.MaxBytesPerSecond = budget })
	sent := unitDomain(t, g, 16)
	g.alive.Store(17)
	now := time.Now()
	total := 0
	for i := 0; i < 100; i++ {
		now = now.Add(100 * time.Millisecond)
		// 4 blocks a round to 16 members: unbudgeted, about 150 KB in 10 s, over the limit.
		g.PrefixStored([]uint64{uint64(i)*1000 + 1, uint64(i)*1000 + 2, uint64(i)*1000 + 3, uint64(i)*1000 + 4})
		g.flush(now)
		g.sendPrefixes(now)
		for _, m := range g.getBroadcasts(3, 1300) {
			total += len(m) + 3
		}
	}
	for _, msgs := range sent {
		total += bytesOf(msgs)
	}
	// The bucket's first second, the 10 s of rounds, and a round's overdraft of two seconds
	// (getBroadcasts refills by the wall clock, the rounds by the simulated one: next to nothing).
	if limit := budget * (1 + 10 + 2); total == 0 || total > limit {
		t.Fatalf("sent %d bytes, budget %d", total, limit)
	}
	if got := int(testutil.ToFloat64(g.met.sent)); got != total {
		t.Fatalf("sent_bytes_total = %d, want %d", got, total)
	}
	// A burst the budget cannot carry to 16 members in two seconds is dropped, and the members
	// are sent the residency again, a few a round as the budget refills.
	burst := make([]uint64, 300)
	for i := range burst {
		burst[i] = uint64(1e9 + i)
	}
	before := dropped(g, dropBandwidth)
	g.PrefixStored(burst)
	unsynced := func() int {
		g.mu.Lock()
		defer g.mu.Unlock()
		n := 0
		for _, p := range g.peers {
			if p.synced != p.bootID {
				n++
			}
		}
		return n
	}
	g.sendPrefixes(now.Add(10 * time.Second))
	if dropped(g, dropBandwidth) == before || len(g.pend) != 0 {
		t.Fatalf("a backlog beyond two seconds of budget was not dropped (%d pending)", len(g.pend))
	}
	if n := unsynced(); n == 0 || n == 16 {
		t.Fatalf("%d of 16 members left to resync after the first round", n)
	}
	for i := 1; i <= 40 && unsynced() > 0; i++ {
		g.sendPrefixes(now.Add(10*time.Second + time.Duration(i)*500*time.Millisecond))
	}
	if n := unsynced(); n != 0 {
		t.Fatalf("%d members never resynced", n)
	}
	if added, _ := decodeAll(t, sent["p16"]); !slices.Contains(added, burst[299]) {
		t.Fatal("p16's resync lacks the burst")
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
	for _, m := range msgs {
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
		"kvmesh_gossip_domain_peers": true, "kvmesh_gossip_name_conflicts_total": true,
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

// TestMemberlistWarningsAreLimited: a flood of bad packets (one error line each) logs the
// limiter's burst, then one a second, that one counting the lines held back; debug lines pass.
func TestMemberlistWarningsAreLimited(t *testing.T) {
	var got []string
	w := newLogWriter(slog.New(attrRecorder{&got}))
	now := time.Unix(1e9, 0)
	w.now = func() time.Time { return now }
	bad := []byte("2026/12/05 01:40:00 [ERR] memberlist: Decrypt packet failed: no installed keys could decrypt the message from=127.0.0.1:9\n")
	for range 100 {
		_, _ = w.Write(bad)
	}
	_, _ = w.Write([]byte("2026/12/05 01:40:00 [DEBUG] memberlist: Stream connection from=127.0.0.1:4\n"))
	if len(got) != logBurst+1 || got[logBurst] != "" {
		t.Fatalf("after 100 errors and a debug line: %d lines %q; want the burst of %d and the debug line", len(got), got, logBurst)
	}
	now = now.Add(time.Second)
	_, _ = w.Write(bad)
	if want := fmt.Sprintf("held_back=%d", 100-logBurst); len(got) != logBurst+2 || got[logBurst+1] != want {
		t.Errorf("a second later: lines %q; want one more with %s", got, want)
	}
}

// attrRecorder keeps, for every record logged through it, its attributes as key=value.
type attrRecorder struct{ lines *[]string }

func (r attrRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r attrRecorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	rec.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, "%s=%v", a.Key, a.Value)
		return true
	})
	*r.lines = append(*r.lines, b.String())
	return nil
}
func (r attrRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r attrRecorder) WithGroup(string) slog.Handler      { return r }

func TestMeshInterval(t *testing.T) {
	for _, tc := range []struct {
		members int
		want    time.Duration
	}{{0, time.Second}, {16, time.Second}, {32, time.Second}, {64, 2 * time.Second}, {128, 6 * time.Second}, {1000, 62500 * time.Millisecond}} {
		if got := MeshInterval(time.Second, tc.members); got != tc.want {
			t.Errorf("MeshInterval(1s, %d) = %v, want %v", tc.members, got, tc.want)
		}
	}
}

// kinds lists the message kinds in msgs.
func kinds(msgs [][]byte) []byte {
	var out []byte
	for _, m := range msgs {
		out = append(out, m[1])
	}
	return out
}

// TestRecordsByDomain pins records in a mesh whose mesh-wide interval is longer than
// PublishInterval: they go straight to the domains' members every PublishInterval (and with
// a new member's residency), through memberlist's gossip only every mesh interval or on a
// change of structure; a member outside the domains is stale only after three mesh intervals;
// a record received straight is applied and not relayed.
func TestRecordsByDomain(t *testing.T) {
	g := newUnit(t, func(c *Config) { c.PublishInterval, c.MeshPublishInterval = time.Second, 10*time.Second })
	sent := unitDomain(t, g, 2)
	// meshQueued is the record queued for the mesh (memberlist keeps the latest of a member).
	meshQueued := func() State {
		t.Helper()
		msgs := g.queue.GetBroadcasts(0, 1<<20)
		if len(msgs) != 1 {
			t.Fatalf("%d records queued for the mesh", len(msgs))
		}
		st, err := DecodeState(msgs[0][2:])
		if err != nil {
			t.Fatal(err)
		}
		g.queue.QueueBroadcast(&namedBroadcast{name: g.cfg.Name, msg: msgs[0]}) // put it back
		return st
	}
	if st := meshQueued(); st.Seq != 1 {
		t.Fatalf("the first record: seq %d queued for the mesh", st.Seq)
	}
	now := time.Now()
	g.sendPrefixes(now)
	if got := kinds(sent["p1"]); !slices.Equal(got, []byte{msgRecord}) {
		t.Fatalf("a new member's sync: kinds %v, want the record (the residency is empty)", got)
	}
	clear(sent)
	for i := 1; i <= 5; i++ { // a second of changes: one record a second to the domain
		at := now.Add(time.Duration(i) * 200 * time.Millisecond)
		g.UpdateLocal(State{Models: []ModelInfo{{Name: "m"}}, Running: i})
		g.flush(at)
		g.sendPrefixes(at)
	}
	if got := kinds(sent["p2"]); !slices.Equal(got, []byte{msgRecord}) {
		t.Fatalf("a second of changes: kinds %v, want one record", got)
	}
	if st := meshQueued(); st.Seq != 1 {
		t.Fatalf("within the mesh interval: seq %d queued for the mesh, want the first", st.Seq)
	}
	g.UpdateLocal(State{Models: []ModelInfo{{Name: "m"}, {Name: "n"}}})
	g.flush(now.Add(2 * time.Second))
	if st := meshQueued(); len(st.Models) != 2 {
		t.Fatalf("a new model: the mesh's record lists %d models, want it at once", len(st.Models))
	}
	g.UpdateLocal(State{Models: []ModelInfo{{Name: "m"}, {Name: "n"}}, Running: 99})
	g.flush(now.Add(12 * time.Second))
	if st := meshQueued(); st.Running != 99 {
		t.Fatal("a mesh interval on: the mesh's record is not the latest")
	}

	// A member outside the domains is stale after three mesh intervals, one inside after three
	// direct intervals (PublishInterval here; StaleAfter, 1 s, is shorter).
	g.memberEvent(&memberlist.Node{Name: "x", Addr: net.IPv4(127, 0, 0, 1), Port: 9}, LivenessAlive)
	old := time.Now().Add(-5 * time.Second)
	g.applyState(State{Name: "x", BootID: 9, Seq: 1, Models: []ModelInfo{{Name: "other"}}}, old)
	g.applyState(State{Name: "p1", BootID: 101, Seq: 9, Models: []ModelInfo{{Name: "m"}}}, old)
	g.mu.Lock()
	x, p1 := g.memberLocked("x", g.peers["x"], time.Now()), g.memberLocked("p1", g.peers["p1"], time.Now())
	g.mu.Unlock()
	if x.Stale || x.MaxAge != 30*time.Second || !p1.Stale || p1.MaxAge != 3*time.Second {
		t.Fatalf("outside: stale %v max age %v; inside: stale %v max age %v", x.Stale, x.MaxAge, p1.Stale, p1.MaxAge)
	}

	// Received straight: applied, not relayed.
	rec, _ := AppendState([]byte{wireVersion, msgRecord}, State{Name: "p2", BootID: 102, Seq: 7, Running: 42, Models: []ModelInfo{{Name: "m"}}})
	queued := g.queue.NumQueued()
	g.handleMsg(rec)
	if m, _ := member(g, "p2"); m.State.Running != 42 || g.queue.NumQueued() != queued {
		t.Fatalf("a direct record: running %d, queued %d → %d", m.State.Running, queued, g.queue.NumQueued())
	}
}

// TestDirectRecordsLeaveRoomForPrefixes pins that in a domain so large that a record to every
// member each PublishInterval would take over half the budget, records go as often as half
// the budget carries them, and the domain's members are stale only after three such periods.
func TestDirectRecordsLeaveRoomForPrefixes(t *testing.T) {
	g := newUnit(t, func(c *Config) { c.PublishInterval, c.MeshPublishInterval = time.Second, time.Hour })
	unitDomain(t, g, 10)
	g.mu.Lock()
	g.rebuildDomainsLocked()
	small := g.directEveryLocked()
	g.mu.Unlock()
	if small != time.Second {
		t.Fatalf("10 members: records every %v, want PublishInterval", small)
	}
	big := newUnit(t, func(c *Config) { c.PublishInterval, c.MeshPublishInterval = time.Second, time.Hour })
	unitDomain(t, big, 1000)
	big.mu.Lock()
	big.rebuildDomainsLocked()
	every := big.directEveryLocked()
	rec := len(big.pubBody) + 4 + packetOverhead
	p1 := big.memberLocked("p1", big.peers["p1"], time.Now())
	big.mu.Unlock()
	want := time.Duration(float64(1000*rec) / float64(big.cfg.MaxBytesPerSecond/2) * float64(time.Second))
	if every != want || every <= time.Second {
		t.Fatalf("1,000 members: records every %v, want %v (half the budget)", every, want)
	}
	if p1.MaxAge != 3*every {
		t.Fatalf("a domain member's max age %v, want %v", p1.MaxAge, 3*every)
	}

	// A round sends records to as many members as half the budget carries, and the next
	// round goes on from there.
	sent := big.direct.(*recorder).sent
	clear(sent)
	big.mu.Lock()
	for _, p := range big.peers {
		p.synced = p.bootID
	}
	big.mu.Unlock()
	now := time.Now()
	big.sendPrefixes(now)
	first := len(sent)
	perRound := int(float64(big.cfg.MaxBytesPerSecond) / 2 * big.cfg.PrefixInterval.Seconds() / float64(rec))
	if first == 0 || first > perRound {
		t.Fatalf("one round sent records to %d members, want 1 to %d", first, perRound)
	}
	big.sendPrefixes(now.Add(big.cfg.PrefixInterval))
	if len(sent) != 2*first {
		t.Fatalf("the second round sent to %d members in all, want %d others", len(sent), first)
	}
}

// TestSmallMeshQueuesEveryRecord pins that up to the size memberlist carries every record of
// (the mesh interval is PublishInterval), every record published goes to memberlist's queue,
// a change within MinPublishInterval's pace included, as before records went by domain.
func TestSmallMeshQueuesEveryRecord(t *testing.T) {
	g := newUnit(t, func(c *Config) { c.PublishInterval, c.MinPublishInterval = time.Second, 200*time.Millisecond })
	unitDomain(t, g, 2)
	now := time.Now()
	g.UpdateLocal(State{Models: []ModelInfo{{Name: "m"}}, Running: 5})
	g.flush(now.Add(300 * time.Millisecond))
	msgs := g.queue.GetBroadcasts(0, 1<<20)
	if len(msgs) != 1 {
		t.Fatalf("%d records queued", len(msgs))
	}
	if st, err := DecodeState(msgs[0][2:]); err != nil || st.Running != 5 {
		t.Fatalf("queued record: running %d (%v), want the change", st.Running, err)
	}
}

// TestClaimedAhead pins the claims index: the other members' claims on a peer that outrank a
// request add up; a record without them, a member's death and a record gone stale each take
// theirs off, and a claim never outranks its own request.
func TestClaimedAhead(t *testing.T) {
	g := newUnit(t, nil)
	now := time.Now()
	for _, name := range []string{"a", "b", "x"} {
		g.memberEvent(&memberlist.Node{Name: name}, LivenessAlive)
	}
	apply := func(name string, seq uint64, at time.Time, claims ...Claim) {
		t.Helper()
		if ok, reason := g.applyState(State{Name: name, BootID: 1, Seq: seq, Claims: claims}, at); !ok {
			t.Fatalf("record of %s refused: %s", name, reason)
		}
	}
	early, late := now.Add(-3*time.Second), now.Add(-time.Second)
	check := func(step string, prio int, arrived time.Time, want map[string]int) {
		t.Helper()
		got := map[string]int{}
		g.ClaimedAhead(got, prio, arrived, "")
		if !maps.Equal(got, want) {
			t.Errorf("%s: ClaimedAhead(%d, %v) = %v, want %v", step, prio, arrived.Sub(now), got, want)
		}
	}
	a1 := Claim{Peer: "x", Blocks: 500, Arrived: early}
	apply("a", 1, now, a1, Claim{Peer: "self", Blocks: 40, Priority: 5, Arrived: late})
	apply("b", 1, now, Claim{Peer: "x", Blocks: 300, Arrived: late})
	check("a request arriving now", 0, now, map[string]int{"x": 800, "self": 40})
	check("a request of unknown arrival", 0, time.Time{}, map[string]int{"x": 800, "self": 40})
	check("b's head, after a's", 0, late, map[string]int{"x": 500, "self": 40})
	check("a's head: its own claim is not ahead of it", 0, early, map[string]int{"self": 40})
	check("a high request", 5, now, map[string]int{"self": 40})
	check("a higher one", 9, time.Time{}, map[string]int{})
	got := map[string]int{}
	if g.ClaimedAhead(got, 0, now, "a"); !maps.Equal(got, map[string]int{"x": 300}) {
		t.Errorf("a request a forwarded: ClaimedAhead = %v, want b's claim alone", got)
	}

	apply("a", 2, now)
	check("a's heads left", 0, now, map[string]int{"x": 300})

	g.memberEvent(&memberlist.Node{Name: "b"}, LivenessDead)
	check("b died", 0, now, map[string]int{})

	apply("x", 1, now.Add(-time.Hour), Claim{Peer: "self", Blocks: 70})
	check("x's record is stale", 0, now, map[string]int{})

	// A large mesh keeps a peer's records fresh for several mesh intervals; its claims count
	// only while the record is StaleAfter old.
	g.mu.Lock()
	g.staleIn, g.staleOut = time.Hour, time.Hour
	g.mu.Unlock()
	apply("x", 2, now.Add(-g.cfg.StaleAfter-time.Second), Claim{Peer: "self", Blocks: 70, Arrived: early})
	check("x's record is fresh, its claim is not", 0, now, map[string]int{})
	apply("x", 3, now, Claim{Peer: "self", Blocks: 70, Arrived: early})
	check("x's claim is fresh", 0, now, map[string]int{"self": 70})
	apply("x", 4, now)

	apply("a", 3, now, Claim{Peer: "x", Blocks: MaxClaimBlocks, Priority: 1}, Claim{Peer: "x", Blocks: MaxClaimBlocks, Priority: 1})
	check("claims at the bound", 0, time.Time{}, map[string]int{"x": MaxClaimBlocks})
}

// TestRecordLeavesClaimsOutToFit pins that a record too large for one broadcast with its
// claims (long names) goes without the ones that do not fit, rather than not at all.
func TestRecordLeavesClaimsOutToFit(t *testing.T) {
	g := newUnit(t, nil)
	st := agentState()
	st.AgentKeys = st.AgentKeys[:32]
	for i := range MaxClaims {
		st.Claims = append(st.Claims, Claim{Peer: fmt.Sprintf("%0128d", i), Blocks: 1000, Arrived: time.Now()})
	}
	g.SetLocal(func() State { return st })
	g.flush(time.Now())
	if n := 2 + len(g.pubBody); n > maxMessage || g.pub.Seq == 0 {
		t.Fatalf("record of %d bytes published (seq %d), want one within %d", n, g.pub.Seq, maxMessage)
	}
	if n := len(g.pub.Claims); n == 0 || n == MaxClaims {
		t.Fatalf("%d claims published, want some of the %d left out to fit", n, MaxClaims)
	}
}
