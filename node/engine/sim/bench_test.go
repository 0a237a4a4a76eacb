package sim

import (
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/kvmesh/kvmesh/node/engine"
)

// BenchmarkStep measures the step loop's scheduling and bookkeeping (no sleeping) with 256
// sequences decoding: schedule, complete, emit tokens to stream buffers. Finished requests are
// replaced outside the timer so the batch stays full.
func BenchmarkStep(b *testing.B) {
	cfg := DefaultConfig()
	cfg.KVBlocks = 1 << 20
	s, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	n := 0
	submit := func() {
		n++
		p := prompt(fmt.Sprint("bench-", n), 512)
		if _, err := s.submit(context.Background(), &engine.Request{Model: testModel, Prompt: p, MaxTokens: 1024, Seed: uint64(n)}); err != nil {
			b.Fatal(err)
		}
	}
	step := func() {
		s.mu.Lock()
		d, ok := s.scheduleLocked()
		var ends []*seq
		if ok {
			ends = s.completeLocked(d)
		}
		s.mu.Unlock()
		for _, q := range ends {
			q.stream.end(io.EOF)
		}
	}
	for range 256 {
		submit()
	}
	// Warm up: prefill everything so the batch is all decodes.
	for s.State().QueuedPrefillTokens > 0 {
		step()
	}
	b.ReportAllocs()
	b.ResetTimer()
	running := 0
	for b.Loop() {
		step()
		if r := len(s.running) + len(s.waiting); r < 256 {
			b.StopTimer()
			for range 256 - r {
				submit()
			}
			b.StartTimer()
		}
		running += len(s.running)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "steps/s")
	b.ReportMetric(float64(running)/float64(b.N), "running/step")
}
