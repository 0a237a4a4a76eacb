package kvconnector

import (
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/node/engine"
)

// TestStoreExpires pins how long a prefill engine holds a handover: until HeldTTL has
// passed, however often it is pulled, and an expired one goes with the next handover kept.
func TestStoreExpires(t *testing.T) {
	s := New("e")
	t0 := time.Unix(1000, 0)
	id := s.Put(&engine.Handover{PromptTokens: 40, KVBytes: 4096, Blocks: []uint64{1<<63 + 5, 2}}, t0)
	for range 2 {
		rec, ok := s.Get(id, t0.Add(HeldTTL))
		if !ok || rec.PromptTokens != 40 || rec.EngineID != s.id || len(rec.Blocks) != 2 || rec.Blocks[0] != "8000000000000005" {
			t.Fatalf("within its TTL: %+v, %v", rec, ok)
		}
	}
	if _, ok := s.Get(id, t0.Add(HeldTTL+time.Nanosecond)); ok {
		t.Error("held past its TTL")
	}
	if _, ok := s.Get("nothing", t0); ok {
		t.Error("an unknown id found")
	}
	s.Put(&engine.Handover{}, t0.Add(HeldTTL+time.Second))
	if len(s.m) != 1 || len(s.order) != 1 {
		t.Errorf("%d held, %d in order after the first expired; want 1", len(s.m), len(s.order))
	}
}
