package kvindex

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

func seq(from, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(1000 + from + i)
	}
	return out
}

func TestAnchor(t *testing.T) {
	var got []int
	for pos := -1; pos < 400; pos++ {
		if Anchor(pos) {
			got = append(got, pos)
		}
	}
	want := []int{0, 1, 3, 7, 15, 31, 63, 127, 191, 255, 319, 383}
	if !slices.Equal(got, want) {
		t.Fatalf("anchors below 400 = %v, want %v", got, want)
	}
	chain := seq(0, 300)
	if got, want := AppendAnchors(nil, chain), []uint64{1000, 1001, 1003, 1007, 1015, 1031, 1063, 1127, 1191, 1255}; !slices.Equal(got, want) {
		t.Fatalf("AppendAnchors(300 blocks) = %v, want %v", got, want)
	}
	for _, tt := range []struct{ n, want int }{{0, 0}, {1, 1}, {2, 2}, {3, 2}, {4, 4}, {63, 32}, {64, 64}, {127, 64}, {128, 128}, {300, 256}} {
		if got := AnchoredLen(tt.n); got != tt.want {
			t.Errorf("AnchoredLen(%d) = %d, want %d", tt.n, got, tt.want)
		}
	}
}

func TestCacheDeltaSplitsAnchors(t *testing.T) {
	var d CacheDelta
	for pos, h := range seq(0, 8) {
		d.Store(h, pos)
	}
	d.Evict(5, 1)
	d.Evict(6, 2)
	if !slices.Equal(d.Stored, seq(0, 8)) || !slices.Equal(d.StoredAnchors, []uint64{1000, 1001, 1003, 1007}) ||
		!slices.Equal(d.Evicted, []uint64{5, 6}) || !slices.Equal(d.EvictedAnchors, []uint64{5}) {
		t.Fatalf("delta %+v", d)
	}
	d.Reset()
	if !d.Empty() || len(d.StoredAnchors)+len(d.EvictedAnchors) != 0 {
		t.Fatalf("after Reset: %+v", d)
	}
}

func TestLongestPrefixAnchoredRule(t *testing.T) {
	req := seq(0, 200) // anchors 0, 1, 3, 7, 15, 31, 63, 127, 191
	without := func(drop ...int) []uint64 {
		var out []uint64
		for i, h := range req {
			if !slices.Contains(drop, i) {
				out = append(out, h)
			}
		}
		return out
	}
	tests := []struct {
		name  string
		req   []uint64 // nil: req
		setup func(x *Index)
		want  []Match
	}{
		{"empty", nil, func(x *Index) {}, nil},
		{"full chain counts to its last anchor", nil, func(x *Index) { x.Add("a", req) }, []Match{{"a", 192}}},
		{"anchors alone match as much", nil, func(x *Index) { x.Add("a", AppendAnchors(nil, req)) }, []Match{{"a", 192}}},
		{"blocks after the last held anchor are not counted", nil, func(x *Index) { x.Add("a", req[:190]) }, []Match{{"a", 128}}},
		{"a gap between anchors is not seen", nil, func(x *Index) { x.Add("a", without(2, 100, 150)) }, []Match{{"a", 192}}},
		{"a missing anchor stops the run", nil, func(x *Index) { x.Add("a", without(63)) }, []Match{{"a", 32}}},
		{"only later anchors score zero", nil, func(x *Index) { x.Add("a", []uint64{req[127], req[191]}) }, nil},
		{"B3 and on without B0 scores zero", nil, func(x *Index) { x.Add("a", req[3:]) }, nil},
		{"order of adding is irrelevant", nil, func(x *Index) { x.Add("a", []uint64{req[3], req[0], req[1]}) }, []Match{{"a", 4}}},
		{"one-block prompt", req[:1], func(x *Index) { x.Add("a", req) }, []Match{{"a", 1}}},
		{"two-block prompt", req[:2], func(x *Index) { x.Add("a", req[:2]); x.Add("b", req[:1]) }, []Match{{"a", 2}, {"b", 1}}},
		{"three-block prompt counts two", req[:3], func(x *Index) { x.Add("a", req[:3]) }, []Match{{"a", 2}}},
		{"several peers sorted longest first then name", req[:5], func(x *Index) {
			x.Add("c", req[:1])
			x.Add("b", req[:4])
			x.Add("a", req[:1])
			x.Add("z", req[1:]) // no block 0
		}, []Match{{"b", 4}, {"a", 1}, {"c", 1}}},
		{"speculative anchors of the chain count", nil, func(x *Index) {
			x.Add("a", req[:64])
			x.AddSpeculative("a", req, t0.Add(time.Second))
		}, []Match{{"a", 192}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := NewIndex(IndexConfig{})
			tt.setup(x)
			r := tt.req
			if r == nil {
				r = req
			}
			got := x.LongestPrefix(r, t0, nil)
			if !slices.Equal(got, tt.want) {
				t.Fatalf("LongestPrefix = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestAddSpeculativeStoresOnlyAnchors(t *testing.T) {
	x := NewIndex(IndexConfig{})
	chain := seq(0, 300)
	x.AddSpeculative("a", chain, t0.Add(time.Second))
	if got := x.Stats(); got.Speculative != 10 || got.Distinct != 10 {
		t.Fatalf("speculation on a 300-block chain: %+v, want its 10 anchors", got)
	}
	if got := x.LongestPrefix(chain, t0, nil); !slices.Equal(got, []Match{{"a", 256}}) {
		t.Fatalf("LongestPrefix = %v, want a at 256", got)
	}
}

func TestLongestPrefixManyPeersBitset(t *testing.T) {
	// More holders than smallSet forces the bitset path; mix it with slice-held blocks.
	x := NewIndex(IndexConfig{})
	req := seq(0, 50)
	var want []Match
	for p := 0; p < 200; p++ {
		n := p % 51
		name := fmt.Sprintf("p%03d", p)
		x.Add(name, req[:n])
		x.Add(name, seq(10_000*(p+1), 5)) // unrelated residency
		if n > 0 {
			want = append(want, Match{name, AnchoredLen(n)})
		}
	}
	slices.SortStableFunc(want, func(a, b Match) int { return b.Blocks - a.Blocks })
	got := x.LongestPrefix(req, t0, nil)
	if !slices.Equal(got, want) {
		t.Fatalf("got %d matches, want %d; first %v vs %v", len(got), len(want), got[:3], want[:3])
	}
	// dst is appended to, not overwritten.
	pre := []Match{{"keep", 9}}
	if got := x.LongestPrefix(req, t0, pre); got[0] != pre[0] || len(got) != len(want)+1 {
		t.Fatalf("dst not preserved: %v", got[:2])
	}
}

func TestLRUCap(t *testing.T) {
	x := NewIndex(IndexConfig{MaxBlocksPerPeer: 3})
	x.Add("a", []uint64{1, 2, 3})
	x.Add("a", []uint64{1}) // refresh: 2 is now least recent
	x.Add("a", []uint64{4})
	if got, want := x.AppendPeerBlocks(nil, "a"), []uint64{3, 1, 4}; !slices.Equal(got, want) {
		t.Fatalf("residency %v, want %v", got, want)
	}
	if n := x.PeerBlocks("a"); n != 3 {
		t.Fatalf("PeerBlocks = %d, want 3", n)
	}
	if m := x.LongestPrefix([]uint64{2}, t0, nil); len(m) != 0 {
		t.Fatalf("evicted block still matches: %v", m)
	}
	x.Add("a", seq(0, 10)) // more than the cap in one call keeps the last 3
	if got := x.AppendPeerBlocks(nil, "a"); !slices.Equal(got, seq(7, 3)) {
		t.Fatalf("after big add: %v", got)
	}
	if len(x.holders) != 3 {
		t.Fatalf("holders map leaks: %d entries", len(x.holders))
	}
}

func TestReplaceRemoveDropPeer(t *testing.T) {
	x := NewIndex(IndexConfig{})
	x.Add("a", seq(0, 4))
	x.Add("b", seq(0, 4))
	x.Remove("a", seq(1, 1))
	x.Remove("nobody", seq(0, 1))
	if m := x.LongestPrefix(seq(0, 4), t0, nil); !slices.Equal(m, []Match{{"b", 4}, {"a", 1}}) {
		t.Fatalf("after Remove: %v", m)
	}
	x.Replace("a", seq(0, 2))
	if got := x.AppendPeerBlocks(nil, "a"); !slices.Equal(got, seq(0, 2)) {
		t.Fatalf("after Replace: %v", got)
	}
	x.Replace("b", nil)
	if n := x.PeerBlocks("b"); n != 0 {
		t.Fatalf("Replace(nil) left %d blocks", n)
	}
	x.DropPeer("a")
	x.DropPeer("a")
	if m := x.LongestPrefix(seq(0, 4), t0, nil); len(m) != 0 {
		t.Fatalf("after DropPeer: %v", m)
	}
	if len(x.holders) != 0 {
		t.Fatalf("holders left: %d", len(x.holders))
	}
	// A dropped id is reused without inheriting residency.
	x.Add("c", seq(100, 1))
	if m := x.LongestPrefix(seq(0, 1), t0, nil); len(m) != 0 {
		t.Fatalf("reused id inherited residency: %v", m)
	}
	if got := x.Peers(); !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("Peers = %v", got)
	}
}

func TestSpeculative(t *testing.T) {
	x := NewIndex(IndexConfig{MaxBlocksPerPeer: 4})
	req := seq(0, 3)
	x.Add("a", req[:1])
	x.AddSpeculative("a", req, t0.Add(time.Second))
	tests := []struct {
		name string
		now  time.Time
		want []Match
	}{
		{"before expiry counts", t0, []Match{{"a", 2}}}, // 3 blocks: anchors 0 and 1
		{"at expiry gone", t0.Add(time.Second), []Match{{"a", 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := x.LongestPrefix(req, tt.now, nil); !slices.Equal(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
	if n := x.PeerBlocks("a"); n != 1 {
		t.Fatalf("speculation counted as confirmed: %d", n)
	}
	// Confirmation supersedes speculation: it outlives the expiry.
	x.Add("a", req[1:2])
	if got := x.LongestPrefix(req, t0.Add(time.Hour), nil); !slices.Equal(got, []Match{{"a", 2}}) {
		t.Fatalf("confirmed block lost: %v", got)
	}
	x.Expire(t0.Add(time.Hour))
	if len(x.peers[0].spec) != 0 || len(x.holders) != 2 {
		t.Fatalf("Expire left spec=%d holders=%d", len(x.peers[0].spec), len(x.holders))
	}
	// Speculation is bounded per peer too, and repeated refreshes do not grow the FIFO.
	for i := 0; i < 1000; i++ {
		x.AddSpeculative("b", seq(i%10, 1), t0.Add(time.Duration(i)*time.Millisecond))
	}
	p := x.peers[x.ids["b"]]
	if len(p.spec) > 4 || len(p.specQ) > 2*4+64+1 {
		t.Fatalf("speculation unbounded: spec=%d fifo=%d", len(p.spec), len(p.specQ))
	}
}

func TestConcurrent(t *testing.T) {
	x := NewIndex(IndexConfig{MaxBlocksPerPeer: 256})
	req := seq(0, 64)
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("w%d", g)
			for i := 0; i < 300; i++ {
				x.Add(name, req[:i%64])
				x.AddSpeculative(name, req, t0.Add(time.Duration(i)))
				x.Remove(name, req[i%64:])
				if i%50 == 0 {
					x.DropPeer(name)
				}
			}
		}()
		go func() {
			defer wg.Done()
			var dst []Match
			for i := 0; i < 300; i++ {
				dst = x.LongestPrefix(req, t0, dst[:0])
				for _, m := range dst {
					if m.Blocks < 1 || m.Blocks > len(req) {
						t.Errorf("bad match %v", m)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	x.Add("final", req)
	if m := x.LongestPrefix(req, t0.Add(time.Hour), nil); len(m) == 0 || m[0] != (Match{"final", 64}) {
		t.Fatalf("after concurrent use: %v", m)
	}
}

func TestLongestPrefixNoAllocs(t *testing.T) {
	// Under the race detector the scratch pool drops a random share of its items, and a call
	// that misses it allocates one scratch.
	want := 0.0
	if raceEnabled {
		want = 1
	}
	x := NewIndex(IndexConfig{})
	req := seq(0, 100)
	for p := 0; p < 100; p++ {
		x.Add(fmt.Sprintf("p%d", p), req[:p])
	}
	dst := make([]Match, 0, 128)
	x.LongestPrefix(req, t0, dst) // warm the scratch pool
	if n := testing.AllocsPerRun(100, func() { dst = x.LongestPrefix(req, t0, dst[:0]) }); n > want {
		t.Fatalf("LongestPrefix allocates %.1f times per call, want at most %v", n, want)
	}
}

// TestStatsCountEntriesAndStayWithinTheCap pins Stats' counts through adds, shared blocks,
// speculative entries, evictions at the cap and a dropped peer.
func TestStatsCountEntriesAndStayWithinTheCap(t *testing.T) {
	x := NewIndex(IndexConfig{MaxBlocksPerPeer: 10})
	x.Add("a", seq(0, 8))
	x.Add("b", seq(4, 8))                                   // 4 blocks shared with a
	x.AddSpeculative("c", seq(100, 4), t0.Add(time.Second)) // its 3 anchors
	want := IndexStats{Peers: 3, Blocks: 16, Speculative: 3, Distinct: 15}
	want.Bytes = 16*EntryBytes + 15*DistinctBytes + 3*SpecEntryBytes
	if got := x.Stats(); got != want {
		t.Fatalf("Stats = %+v, want %+v", got, want)
	}
	x.Add("a", seq(50, 30)) // past the cap: a keeps its 10 most recent
	if got := x.Stats(); got.Blocks != 18 || got.Distinct != 3+8+10 {
		t.Fatalf("after a's evictions: %+v", got)
	}
	x.DropPeer("b")
	x.Expire(t0.Add(time.Second))
	if got := x.Stats(); got.Peers != 2 || got.Blocks != 10 || got.Speculative != 0 || got.Distinct != 10 {
		t.Fatalf("after dropping b and expiring c: %+v", got)
	}
}
