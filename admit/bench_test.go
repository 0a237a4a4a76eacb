package admit

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkCheck measures one full admission decision (all seven layers, a keyed tenant with
// a token bucket that never runs dry, three candidates, an empty room).
func BenchmarkCheck(b *testing.B) {
	c := testConfig()
	a, err := New(c)
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]KeyEntry, 100)
	for i := range keys {
		keys[i] = KeyEntry{SHA256: HashKey(fmt.Sprint("key", i)), Tenant: fmt.Sprint("t", i), Rate: 1e12, Burst: 1e9}
	}
	if err := a.Keys().Replace(keys, t0); err != nil {
		b.Fatal(err)
	}
	req := baseReq()
	req.APIKey = "key42"
	opts := []Option{idle(), idle(), idle()}
	opts[0].FreeKVBlocks = 0
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		if d := a.Check(t0, req, opts); d.Action != Accept {
			b.Fatalf("%+v", d)
		}
	}
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N), "ns/decision")
}

// BenchmarkWaitingRoom measures Push/Next cycles with 10k requests queued across 16 tenants
// and 3 bands, reporting dispatches per second.
func BenchmarkWaitingRoom(b *testing.B) {
	q := DefaultConfig().Queue
	q.MaxRequests, q.MaxTokens, q.MaxTotal = 1<<20, 1<<40, 1<<20
	r, err := NewWaitingRoom(q)
	if err != nil {
		b.Fatal(err)
	}
	mk := func(i int) *Item {
		return &Item{ID: fmt.Sprint(i), Model: "m", Tenant: fmt.Sprint("t", i%16), Priority: i%3 - 1,
			Tokens: 100 + i%900, Arrived: t0, Deadline: t0.Add(time.Duration(i%5000) * time.Millisecond)}
	}
	const queued = 10_000
	for i := range queued {
		if _, err := r.Push(t0, mk(i)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	i := 0
	for b.Loop() {
		it, ok := r.Next(t0, nil)
		if !ok {
			b.Fatal("empty")
		}
		// Recycle the dispatched item so the room stays at 10k.
		it.ID = fmt.Sprint("n", i)
		it.Expires = time.Time{}
		if _, err := r.Push(t0, it); err != nil {
			b.Fatal(err)
		}
		i++
	}
	el := time.Since(start)
	b.ReportMetric(float64(b.N)/el.Seconds(), "dispatches/s")
	if r.Len() != queued {
		b.Fatalf("Len %d", r.Len())
	}
}
