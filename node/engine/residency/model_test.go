package residency

import (
	"errors"
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/kvindex"
)

const bt = 16 // block tokens in these tests

// chain is a prompt's full blocks: hashes base+0 .. base+n-1. Two chains with the same base
// share their common prefix, as kvindex's chained hashes of two prompts with a common text do.
func chain(base uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = base + uint64(i)
	}
	return out
}

// tokens is a prompt of n full blocks and a partial block of 2 tokens.
func tokens(n int) int { return n*bt + 2 }

func newModel(t *testing.T, capacity int) *Model {
	t.Helper()
	m, err := New(capacity, bt)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// serve runs one request through the model: predicted at dispatch, acquired at its first
// token, released after output more tokens. It returns the prediction and every change.
func serve(m *Model, blocks []uint64, output int) (Prediction, Delta) {
	var d Delta
	p := m.Predict(blocks, tokens(len(blocks)))
	h := m.Acquire(blocks, tokens(len(blocks)), &d)
	m.Release(h, tokens(len(blocks))+output, &d)
	return p, d
}

func sorted(s []uint64) []uint64 {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func TestNewRefusesNonPositive(t *testing.T) {
	for _, c := range [][2]int{{0, 16}, {4, 0}, {-1, 16}} {
		if _, err := New(c[0], c[1]); !errors.Is(err, ErrConfig) {
			t.Errorf("New(%d, %d) = %v, want ErrConfig", c[0], c[1], err)
		}
	}
	if m := newModel(t, MaxBlocks*2); m.Capacity() != MaxBlocks {
		t.Errorf("capacity %d, want the cap %d", m.Capacity(), MaxBlocks)
	}
}

// TestPredictIsTheContiguousRunCappedBelowThePrompt: a prediction counts blocks from block 0
// until the first the model lacks, and never the whole prompt.
func TestPredictIsTheContiguousRunCappedBelowThePrompt(t *testing.T) {
	m := newModel(t, 100)
	var d Delta
	m.Release(m.Acquire(chain(1, 4), tokens(4), &d), tokens(4), &d) // blocks 1..4
	m.Release(m.Acquire([]uint64{50, 51}, tokens(2), &d), tokens(2), &d)
	tests := []struct {
		name   string
		blocks []uint64
		tokens int
		want   int
	}{
		{"all held, partial block left to compute", chain(1, 4), tokens(4), 4},
		{"exact multiple: the last block is computed", chain(1, 4), 4 * bt, 3},
		{"longer prompt sharing the prefix", chain(1, 6), tokens(6), 4},
		{"shorter prompt", chain(1, 2), tokens(2), 2},
		{"a gap ends the run", []uint64{1, 2, 99, 4}, tokens(4), 2},
		{"block 0 missing scores nothing", []uint64{99, 2, 3}, tokens(3), 0},
		{"another chain", []uint64{50, 51, 52}, tokens(3), 2},
		{"empty prompt", nil, 0, 0},
		{"one token", chain(1, 1)[:0], 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := m.Predict(tt.blocks, tt.tokens)
			if p.Blocks != tt.want || p.Tokens != tt.want*bt {
				t.Errorf("Predict = %d blocks, %d tokens; want %d blocks", p.Blocks, p.Tokens, tt.want)
			}
		})
	}
}

// TestLRUEvictionAtCapacity pins down what leaves the model when served prompts outgrow its
// capacity: least recently used first, a prefix from its end, never a running request's
// blocks, and room for the running requests' partial and output blocks.
func TestLRUEvictionAtCapacity(t *testing.T) {
	tests := []struct {
		name     string
		capacity int
		run      func(m *Model, d *Delta)
		resident []uint64 // least recent first
		evicted  []uint64 // in order
	}{
		{
			name: "fits: nothing evicted", capacity: 8,
			run: func(m *Model, d *Delta) {
				m.Release(m.Acquire(chain(1, 3), tokens(3), d), tokens(3)+1, d)
				m.Release(m.Acquire(chain(11, 3), tokens(3), d), tokens(3)+1, d)
			},
			resident: []uint64{3, 2, 1, 13, 12, 11},
		},
		{
			// 3 + 3 blocks and one partial block of the running request in 6: the older
			// prompt loses its last block first.
			name: "the older prompt loses its tail first", capacity: 6,
			run: func(m *Model, d *Delta) {
				m.Release(m.Acquire(chain(1, 3), tokens(3), d), tokens(3), d)
				m.Release(m.Acquire(chain(11, 3), tokens(3), d), tokens(3), d)
			},
			resident: []uint64{2, 1, 13, 12, 11},
			evicted:  []uint64{3},
		},
		{
			name: "a reused prompt is the most recent", capacity: 7,
			run: func(m *Model, d *Delta) {
				m.Release(m.Acquire(chain(1, 3), tokens(3), d), tokens(3), d)
				m.Release(m.Acquire(chain(11, 3), tokens(3), d), tokens(3), d)
				m.Release(m.Acquire(chain(1, 2), tokens(2), d), tokens(2), d) // hits 1, 2
				m.Release(m.Acquire(chain(21, 2), tokens(2), d), tokens(2), d)
			},
			// 3 goes, then chain 11's tail: the reused prefix of chain 1 is more recent.
			resident: []uint64{12, 11, 2, 1, 22, 21},
			evicted:  []uint64{3, 13},
		},
		{
			// Output blocks take room while the request runs: 2 prompt blocks, 2 more tokens
			// and 40 output tokens are 5 blocks, 3 beyond the prompt's, which evict 2 blocks of
			// the older prompt and are freed at the end.
			name: "output evicts while it runs", capacity: 6,
			run: func(m *Model, d *Delta) {
				m.Release(m.Acquire(chain(1, 3), tokens(3), d), tokens(3), d)
				m.Release(m.Acquire(chain(11, 2), tokens(2), d), tokens(2)+40, d)
			},
			resident: []uint64{1, 12, 11},
			evicted:  []uint64{3, 2},
		},
		{
			name: "a running request's blocks are pinned", capacity: 4,
			run: func(m *Model, d *Delta) {
				h := m.Acquire(chain(1, 3), tokens(3), d)
				m.Release(m.Acquire(chain(11, 3), tokens(3), d), tokens(3), d)
				// Over capacity while chain 1 runs; chain 11 gave way as far as it could.
				if m.Len() != 3 {
					panic("pinned blocks evicted")
				}
				m.Release(h, tokens(3), d)
			},
			resident: []uint64{3, 2, 1},
			evicted:  []uint64{13, 12, 11},
		},
		{
			name: "shrinking the capacity evicts", capacity: 10,
			run: func(m *Model, d *Delta) {
				m.Release(m.Acquire(chain(1, 3), tokens(3), d), tokens(3), d)
				m.Release(m.Acquire(chain(11, 3), tokens(3), d), tokens(3), d)
				m.SetCapacity(2, d)
			},
			resident: []uint64{12, 11},
			evicted:  []uint64{3, 2, 1, 13},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newModel(t, tt.capacity)
			var d Delta
			tt.run(m, &d)
			if got := m.Resident(nil); !slices.Equal(got, tt.resident) {
				t.Errorf("resident %v, want %v", got, tt.resident)
			}
			if !slices.Equal(d.Evicted, tt.evicted) {
				t.Errorf("evicted %v, want %v", d.Evicted, tt.evicted)
			}
			// Every block stored and not evicted is resident: the delta replays the model.
			replay := slices.DeleteFunc(slices.Clone(d.Stored), func(h uint64) bool { return slices.Contains(d.Evicted, h) })
			if !slices.Equal(sorted(replay), sorted(tt.resident)) {
				t.Errorf("stored − evicted = %v, resident %v", sorted(replay), sorted(tt.resident))
			}
		})
	}
}

// TestCorrect pins down the correction both ways: a shortfall evicts what the engine lost (by
// LRU order, everything last used no later than the first missing block) but not the prompt it
// just stored again; an excess stores what the engine held; boundaries of two tokenisations and
// of a larger engine block are not errors.
func TestCorrect(t *testing.T) {
	old, mid, long := chain(100, 3), chain(200, 2), chain(1, 6)
	tests := []struct {
		name string
		// The model serves old, mid and long (in that order, so long is the most recent),
		// then predicts prompt, then (when served) runs it before the report.
		prompt   []uint64
		served   bool
		report   Report
		promptK  int // kvmesh tokens of prompt; 0: tokens(len(prompt))
		want     Outcome
		dropped  []uint64 // evicted by the correction, in order
		added    []uint64
		resident []uint64 // sorted
	}{
		{
			name: "exact", prompt: chain(1, 6), served: true,
			report: Report{PromptTokens: tokens(6), CachedTokens: 6 * bt},
			want:   Outcome{PromptTokens: tokens(6), PredictedTokens: 6 * bt, ReportedTokens: 6 * bt},
		},
		{
			// Predicted 6 blocks, the engine had 2: it evicted block 2 of long and so, by LRU,
			// everything used before it: old, mid and long's tail. Long itself was served
			// again, so it stays.
			name: "shortfall after serving", prompt: chain(1, 6), served: true,
			report:  Report{PromptTokens: tokens(6), CachedTokens: 2 * bt},
			want:    Outcome{PromptTokens: tokens(6), PredictedTokens: 6 * bt, ReportedTokens: 2 * bt, Dropped: 5},
			dropped: []uint64{102, 101, 100, 201, 200},
		},
		{
			// Judged without serving it again: long's blocks 2.. were last used no later than
			// block 2, so they go too; blocks 0 and 1 stay.
			name: "shortfall without serving", prompt: chain(1, 6),
			report:  Report{PromptTokens: tokens(6), CachedTokens: 2 * bt},
			want:    Outcome{PromptTokens: tokens(6), PredictedTokens: 6 * bt, ReportedTokens: 2 * bt, Dropped: 9},
			dropped: []uint64{102, 101, 100, 201, 200, 6, 5, 4, 3},
		},
		{
			name: "nothing cached: the whole model was older", prompt: chain(200, 2),
			report:  Report{PromptTokens: tokens(2), CachedTokens: 0},
			want:    Outcome{PromptTokens: tokens(2), PredictedTokens: 2 * bt, Dropped: 5},
			dropped: []uint64{102, 101, 100, 201, 200},
		},
		{
			// The prompt extends long by 4 blocks and the engine held 8 of them: the model
			// missed a store of blocks 7 and 8.
			name: "excess stores the reported blocks", prompt: chain(1, 10),
			report: Report{PromptTokens: tokens(10), CachedTokens: 8 * bt},
			want:   Outcome{PromptTokens: tokens(10), PredictedTokens: 6 * bt, ReportedTokens: 8 * bt, Added: 2},
			added:  []uint64{8, 7},
		},
		{
			name: "excess on an unknown prompt", prompt: chain(300, 4),
			report: Report{PromptTokens: tokens(4), CachedTokens: 3 * bt},
			want:   Outcome{PromptTokens: tokens(4), ReportedTokens: 3 * bt, Added: 3},
			added:  []uint64{302, 301, 300},
		},
		{
			// A real tokenizer counts 9% more tokens: 6 blocks predicted are 104 of its
			// tokens, rounded down to its 16-token blocks 96; it reports 90, less than one of
			// its blocks short: the boundary between two tokenisations, not an eviction.
			name: "tokenisation slack", prompt: chain(1, 6),
			report: Report{PromptTokens: 107, CachedTokens: 90},
			want:   Outcome{PromptTokens: 107, PredictedTokens: 96, ReportedTokens: 90},
		},
		{
			name: "tokenisation: more than a block short is an eviction", prompt: chain(1, 6),
			report:  Report{PromptTokens: 107, CachedTokens: 48},
			want:    Outcome{PromptTokens: 107, PredictedTokens: 96, ReportedTokens: 48, Dropped: 9},
			dropped: []uint64{102, 101, 100, 201, 200, 6, 5, 4, 3},
		},
		{
			// The engine's blocks are 64 tokens: 6 × 16 = 96 predicted tokens are one block
			// of 64 as the engine reports them.
			name: "a larger engine block", prompt: chain(1, 6),
			report: Report{PromptTokens: tokens(6), CachedTokens: 64, EngineBlockTokens: 64},
			want:   Outcome{PromptTokens: tokens(6), PredictedTokens: 64, ReportedTokens: 64},
		},
		{
			name: "no prompt count from the engine: kvmesh's stands in", prompt: chain(1, 6),
			report: Report{CachedTokens: 6 * bt},
			want:   Outcome{PromptTokens: tokens(6), PredictedTokens: 6 * bt, ReportedTokens: 6 * bt},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newModel(t, 100)
			for _, c := range [][]uint64{old, mid, long} {
				serve(m, c, 1)
			}
			before := m.Resident(nil)
			promptK := tt.promptK
			if promptK == 0 {
				promptK = tokens(len(tt.prompt))
			}
			var d Delta
			p := m.Predict(tt.prompt, promptK)
			if tt.served {
				m.Release(m.Acquire(tt.prompt, promptK, &d), promptK+1, &d)
			}
			stored := len(d.Stored)
			evicted := len(d.Evicted)
			got := m.Correct(p, tt.prompt, promptK, tt.report, &d)
			if got != tt.want {
				t.Errorf("outcome %+v, want %+v", got, tt.want)
			}
			if g := d.Evicted[evicted:]; !slices.Equal(g, tt.dropped) {
				t.Errorf("dropped %v, want %v", g, tt.dropped)
			}
			if g := d.Stored[stored:]; !slices.Equal(g, tt.added) {
				t.Errorf("added %v, want %v", g, tt.added)
			}
			want := slices.DeleteFunc(slices.Clone(before), func(h uint64) bool { return slices.Contains(tt.dropped, h) })
			want = append(want, tt.added...)
			if tt.served {
				for _, h := range tt.prompt {
					if !slices.Contains(want, h) {
						want = append(want, h)
					}
				}
			}
			if g := m.Resident(nil); !slices.Equal(sorted(g), sorted(want)) {
				t.Errorf("resident %v, want %v", sorted(g), sorted(want))
			}
		})
	}
}

func TestErrorRatio(t *testing.T) {
	tests := []struct {
		o    Outcome
		want float64
	}{
		{Outcome{PromptTokens: 100, PredictedTokens: 64, ReportedTokens: 64}, 0},
		{Outcome{PromptTokens: 100, PredictedTokens: 64, ReportedTokens: 32}, 0.32},
		{Outcome{PromptTokens: 100, PredictedTokens: 0, ReportedTokens: 96}, 0.96},
		{Outcome{}, 0},
	}
	for _, tt := range tests {
		if got := tt.o.ErrorRatio(); got != tt.want {
			t.Errorf("%+v: ratio %v, want %v", tt.o, got, tt.want)
		}
	}
}

// TestClearForgetsEverything: after an engine restart the model is empty, every block is in
// the delta's evictions, and what was in flight across it changes nothing.
func TestClearForgetsEverything(t *testing.T) {
	m := newModel(t, 10)
	serve(m, chain(1, 3), 1)
	var d Delta
	p := m.Predict(chain(11, 2), tokens(2))
	pOld := m.Predict(chain(1, 3), tokens(3))
	h := m.Acquire(chain(11, 2), tokens(2), &d) // running across the restart
	d.Reset()
	m.Clear(&d)
	if m.Len() != 0 || len(m.Resident(nil)) != 0 {
		t.Fatalf("%d blocks after Clear", m.Len())
	}
	if want := []uint64{1, 2, 3, 11, 12}; !slices.Equal(sorted(d.Evicted), want) || len(d.Stored) != 0 {
		t.Errorf("Clear delta %+v, want evicted %v", d, want)
	}
	d.Reset()
	m.Release(h, tokens(2)+100, &d)
	if o := m.Correct(pOld, chain(1, 3), tokens(3), Report{CachedTokens: 0}, &d); o.Dropped != 0 {
		t.Errorf("a prediction from before Clear corrected the model: %+v", o)
	}
	if o := m.Correct(p, chain(11, 2), tokens(2), Report{CachedTokens: 2 * bt}, &d); o.Added != 0 {
		t.Errorf("a prediction from before Clear corrected the model: %+v", o)
	}
	if !d.Empty() || m.Len() != 0 {
		t.Errorf("changes after Clear from what began before it: %+v, %d blocks", d, m.Len())
	}
	// The model works on: capacity, holds and reservations start over.
	for i := range 5 {
		serve(m, chain(uint64(100*(i+1)), 2), 1)
	}
	if m.Len() != 9 { // 10 blocks, less one evicted for the partial block of the last request
		t.Errorf("%d blocks after refilling, want 9", m.Len())
	}
}

func TestReleaseTwiceIsHarmless(t *testing.T) {
	m := newModel(t, 9)
	var d Delta
	h := m.Acquire(chain(1, 2), tokens(2), &d)
	m.Release(h, tokens(2), &d)
	m.Release(h, tokens(2), &d)
	m.Release(nil, 0, &d)
	serve(m, chain(11, 7), 1)
	// 9 blocks and the partial one in 9: block 2 made way. Had the second Release given the
	// partial block's room back twice, nothing would have.
	if got := m.Resident(nil); !slices.Equal(got, []uint64{1, 17, 16, 15, 14, 13, 12, 11}) {
		t.Errorf("resident %v", got)
	}
}

// TestEngineSaidEvictions: EvictOldest and Cap take the least recently used unpinned blocks
// (a prefix from its end), never a running request's, and only as many as there are.
func TestEngineSaidEvictions(t *testing.T) {
	m := newModel(t, 100)
	serve(m, chain(1, 3), 0)  // LRU order after: 3 2 1
	serve(m, chain(11, 2), 0) // then 12 11
	var d Delta
	running := m.Acquire(chain(21, 2), tokens(2), &d)
	d.Reset()

	if n := m.EvictOldest(2, &d); n != 2 || !slices.Equal(d.Evicted, []uint64{3, 2}) {
		t.Errorf("EvictOldest(2) evicted %d: %v, want [3 2]", n, d.Evicted)
	}
	d.Reset()
	// 3 unpinned blocks left (1, 12, 11); a cap of 1 evicts 2 of them, not the running ones.
	if n := m.Cap(1, &d); n != 2 || !slices.Equal(d.Evicted, []uint64{1, 12}) {
		t.Errorf("Cap(1) evicted %d: %v, want [1 12]", n, d.Evicted)
	}
	d.Reset()
	if n := m.Cap(5, &d); n != 0 {
		t.Errorf("Cap above the unpinned count evicted %d", n)
	}
	if n := m.EvictOldest(10, &d); n != 1 || !slices.Equal(d.Evicted, []uint64{11}) {
		t.Errorf("EvictOldest(10) with one unpinned block evicted %d: %v", n, d.Evicted)
	}
	if got := sorted(m.Resident(nil)); !slices.Equal(got, []uint64{21, 22}) {
		t.Errorf("resident %v, want the running request's [21 22]", got)
	}
	d.Reset()
	m.Release(running, tokens(2), &d)
	if n := m.Cap(0, &d); n != 2 {
		t.Errorf("Cap(0) after the release evicted %d, want 2", n)
	}
}

// TestAnchorsByChainPosition pins that the model's reports and ResidentAnchors name exactly the
// anchors of the chains it stored, by each block's place in its chain, through stores,
// evictions and a Clear.
func TestAnchorsByChainPosition(t *testing.T) {
	m := newModel(t, 300)
	c := chain(1000, 200)
	_, d := serve(m, c, 0)
	if got, want := sorted(d.StoredAnchors), kvindex.AppendAnchors(nil, c); !slices.Equal(got, want) {
		t.Fatalf("stored anchors %v, want %v", got, want)
	}
	if got, want := sorted(m.ResidentAnchors(nil)), kvindex.AppendAnchors(nil, c); !slices.Equal(got, want) {
		t.Fatalf("ResidentAnchors %v, want %v", got, want)
	}
	d.Reset()
	m.SetCapacity(100, &d) // the chain's last 100 blocks go, its tail first
	if want := []uint64{1191, 1127}; !slices.Equal(d.EvictedAnchors, want) || len(d.Evicted) != 100 {
		t.Fatalf("evicted %d blocks, anchors %v, want 100 and %v", len(d.Evicted), d.EvictedAnchors, want)
	}
	if got, want := sorted(m.ResidentAnchors(nil)), kvindex.AppendAnchors(nil, c[:100]); !slices.Equal(got, want) {
		t.Fatalf("ResidentAnchors after eviction %v, want %v", got, want)
	}
	d.Reset()
	m.Clear(&d)
	if got, want := sorted(d.EvictedAnchors), kvindex.AppendAnchors(nil, c[:100]); !slices.Equal(got, want) || len(d.StoredAnchors) != 0 {
		t.Fatalf("Clear evicted anchors %v, want %v", got, want)
	}
}
