package external

import (
	"log/slog"
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/engine/kvevents"
)

// TestKVEventsDriveTheResidencyModel applies a server's KV events to a model of 8 16-token
// blocks, step by step, and checks what each evicts.
func TestKVEventsDriveTheResidencyModel(t *testing.T) {
	var log prefixLog
	r, err := newShadow(Config{Kind: KindVLLM, BlockTokens: 16, NominalKVBlocks: 8, KVEvents: "tcp://127.0.0.1:5557",
		OnPrefix: log.on}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	serve := func(blocks []uint64) {
		req := request(blocks)
		tk := r.dispatch(req)
		r.prefilled(tk)
		r.finished(tk, &engine.Usage{PromptTokens: req.PromptTokens, CompletionTokens: 1}, false)
	}
	stored := func(size, n int) kvevents.Event {
		return kvevents.Event{Kind: kvevents.BlockStored, Hashes: chain(1000+uint64(len(r.kv.held)), n), BlockSize: size}
	}
	removed := func(n int) kvevents.Event {
		return kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: make([]uint64, n)}
	}
	batch := func(evs ...kvevents.Event) kvevents.Batch { return kvevents.Batch{Events: evs} }
	steps := []struct {
		name    string
		before  func()
		batch   kvevents.Batch
		evicted []uint64
		len     int
	}{
		{
			name:   "two removed blocks evict the two least recent, a prefix from its end",
			before: func() { serve(chain(1, 3)); serve(chain(11, 3)) },
			batch:  batch(removed(2)), evicted: []uint64{3, 2}, len: 4,
		},
		{
			name:  "an offloaded tier's removals are not the GPU cache's",
			batch: batch(kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: make([]uint64, 4), Medium: "CPU"}), len: 4,
		},
		{
			name:  "1-token blocks add up to a 16-token one",
			batch: batch(stored(1, 1), removed(20)), evicted: []uint64{1}, len: 3,
		},
		{
			name:  "and the remainder carries over",
			batch: batch(removed(12)), evicted: []uint64{13}, len: 2,
		},
		{
			// 7 blocks and a partial one do not fit beside the 2 held: the model evicted
			// those 2 for room itself, so the server's removal of 2 evicts nothing more.
			name:   "what the model evicted for room is not evicted twice",
			before: func() { serve(chain(21, 7)) },
			batch:  batch(stored(16, 1), removed(2)), len: 7,
		},
		{
			name:  "a removal beyond it evicts",
			batch: batch(removed(1)), evicted: []uint64{27}, len: 6,
		},
		{
			name:  "a clear empties the model",
			batch: batch(kvevents.Event{Kind: kvevents.AllBlocksCleared}), evicted: []uint64{26, 25, 24, 23, 22, 21}, len: 0,
		},
		{
			name:   "read since the clear, the server's count caps the model",
			before: func() { serve(chain(31, 3)); serve(chain(41, 3)) },
			batch:  batch(stored(16, 2)), evicted: []uint64{33, 32, 31, 43}, len: 2,
		},
		{
			name:   "after missed batches it does not",
			before: func() { serve(chain(51, 3)) },
			batch:  kvevents.Batch{Missed: true, Events: []kvevents.Event{stored(16, 1)}}, len: 5,
		},
		{
			name:  "a restarted server read from its first batch does again",
			batch: kvevents.Batch{Restarted: true, Events: []kvevents.Event{stored(16, 2)}}, evicted: []uint64{42, 41, 53}, len: 2,
		},
	}
	for _, st := range steps {
		if st.before != nil {
			st.before()
		}
		log.take()
		r.onKVBatch(st.batch)
		_, evicted := log.take()
		if !slices.Equal(evicted, st.evicted) || r.model.Len() != st.len {
			t.Fatalf("%s: evicted %v, %d blocks left; want %v, %d", st.name, evicted, r.model.Len(), st.evicted, st.len)
		}
	}
}
