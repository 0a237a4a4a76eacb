package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node/engine"
)

const testModel = "llama-3.1-8b"

// newTestSim builds a fast Sim (TimeScale 1e4) with a small pool, closed at cleanup.
func newTestSim(t *testing.T, mod func(*Config)) *Sim {
	t.Helper()
	cfg := DefaultConfig()
	cfg.TimeScale = 1e4
	cfg.KVBlocks = 256
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// prompt returns a prompt of exactly tokens tokens whose text is unique to tag.
func prompt(tag string, tokens int) []byte {
	var b strings.Builder
	for i := 0; b.Len() < tokens*4; i++ {
		fmt.Fprintf(&b, "%s-%d ", tag, i)
	}
	return []byte(b.String()[:tokens*4])
}

// fullSeed returns a seed whose natural length is maxTokens, so the request runs to the end.
func fullSeed(t *testing.T, p []byte, maxTokens int) uint64 {
	t.Helper()
	for seed := uint64(0); seed < 1000; seed++ {
		if naturalLength(textSeed(seed, p), maxTokens) == maxTokens {
			return seed
		}
	}
	t.Fatal("no full-length seed found")
	return 0
}

type result struct {
	text   string
	last   engine.Chunk
	chunks int
	timing Timing
}

// drain reads st to the end, failing the test on any error but io.EOF.
func drain(t *testing.T, st engine.Stream) result {
	t.Helper()
	var r result
	var b strings.Builder
	for {
		c, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		if r.last.FinishReason != "" {
			t.Fatalf("chunk after the final chunk: %+v", c)
		}
		b.WriteString(c.Text)
		r.chunks++
		r.last = c
	}
	if r.last.FinishReason == "" || r.last.Usage == nil {
		t.Fatalf("stream ended without a final chunk: %+v", r.last)
	}
	r.text = b.String()
	r.timing = st.(*Stream).Timing()
	return r
}

func gen(t *testing.T, s *Sim, req *engine.Request) result {
	t.Helper()
	st, err := s.Generate(context.Background(), req)
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return drain(t, st)
}

func stepTime(c Config, tokens, ctx int) time.Duration {
	return c.StepFixed + time.Duration(tokens)*c.StepPerToken + time.Duration(ctx)*c.StepPerContextToken
}

// prefixLog records OnPrefix calls.
type prefixLog struct {
	mu sync.Mutex
	d  kvindex.CacheDelta
}

func (l *prefixLog) on(d kvindex.CacheDelta) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.d.Stored = append(l.d.Stored, d.Stored...)
	l.d.Evicted = append(l.d.Evicted, d.Evicted...)
	l.d.StoredAnchors = append(l.d.StoredAnchors, d.StoredAnchors...)
	l.d.EvictedAnchors = append(l.d.EvictedAnchors, d.EvictedAnchors...)
}

func (l *prefixLog) snapshot() (stored, evicted []uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.d.Stored), slices.Clone(l.d.Evicted)
}

// anchors returns the stored and evicted anchors reported so far.
func (l *prefixLog) anchors() (stored, evicted []uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.d.StoredAnchors), slices.Clone(l.d.EvictedAnchors)
}
