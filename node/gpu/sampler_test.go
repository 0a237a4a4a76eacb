package gpu

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// flaky is a Source that fails while fail is set and counts Close calls.
type flaky struct {
	inner  Source
	fail   atomic.Bool
	closes atomic.Int32
	reads  atomic.Int32
}

func (f *flaky) Read() (Reading, error) {
	f.reads.Add(1)
	if f.fail.Load() {
		return Reading{}, errors.New("gpu: device fell off the bus")
	}
	return f.inner.Read()
}

func (f *flaky) Close() error { f.closes.Add(1); return nil }

func newSampler(t *testing.T, src Source, reg prometheus.Registerer) *Sampler {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Source, cfg.Registerer, cfg.Interval = src, reg, 5*time.Millisecond
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func simAt(t *testing.T, now time.Time, devices int, load float64) *Sim {
	t.Helper()
	cfg := DefaultSimConfig()
	cfg.Devices = devices
	cfg.Now = func() time.Time { return now }
	cfg.Load = func() float64 { return load }
	s, err := NewSim(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSamplerMetricsGolden(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	s := newSampler(t, simAt(t, t0, 2, 0.5), reg)
	if _, err := s.Sample(); err != nil {
		t.Fatal(err)
	}
	golden, err := os.ReadFile("testdata/metrics.golden")
	if err != nil {
		t.Fatal(err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(string(golden))); err != nil {
		t.Fatal(err)
	}
}

func TestSamplerKeepsLastGoodReading(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	src := &flaky{inner: simAt(t, t0, 1, 1)}
	s := newSampler(t, src, reg)
	if !s.Latest().At.IsZero() {
		t.Fatal("Latest before any read is not zero")
	}
	good, err := s.Sample()
	if err != nil {
		t.Fatal(err)
	}
	src.fail.Store(true)
	for range 3 {
		if _, err := s.Sample(); err == nil {
			t.Fatal("failing source sampled without error")
		}
	}
	if got := s.Latest(); got.PowerWatts() != good.PowerWatts() || !got.At.Equal(good.At) {
		t.Fatalf("Latest = %+v, want the last good reading", got)
	}
	if s.Err() == nil {
		t.Fatal("Err nil after failures")
	}
	if got := testutil.ToFloat64(s.m.readErrors); got != 3 {
		t.Fatalf("read errors = %v, want 3", got)
	}
	src.fail.Store(false)
	if _, err := s.Sample(); err != nil || s.Err() != nil {
		t.Fatalf("recovery: %v / %v", err, s.Err())
	}
}

func TestSamplerDropsVanishedDevices(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	var mu sync.Mutex
	src := simAt(t, t0, 4, 0)
	sw := &switchSource{cur: src, mu: &mu}
	s := newSampler(t, sw, reg)
	if _, err := s.Sample(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	sw.cur = simAt(t, t0, 2, 0)
	mu.Unlock()
	if _, err := s.Sample(); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(s.m.power); n != 2 {
		t.Fatalf("power series = %d, want 2 after devices went from 4 to 2", n)
	}
}

type switchSource struct {
	mu  *sync.Mutex
	cur Source
}

func (s *switchSource) Read() (Reading, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.cur.Read() }
func (s *switchSource) Close() error           { return nil }

func TestSamplerRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &flaky{inner: &None{}}
		s := newSampler(t, src, nil) // Interval 5 ms
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		synctest.Wait()
		if n := src.reads.Load(); n != 1 || s.Latest().At.IsZero() {
			t.Fatalf("reads at start = %d, latest %v; want one read at once", n, s.Latest().At)
		}
		time.Sleep(4 * time.Millisecond) // fake time: short of one interval
		synctest.Wait()
		if n := src.reads.Load(); n != 1 {
			t.Fatalf("reads before the interval = %d, want 1", n)
		}
		time.Sleep(11 * time.Millisecond) // now 15 ms: three intervals
		synctest.Wait()
		if n := src.reads.Load(); n != 4 {
			t.Fatalf("reads after 3 intervals = %d, want 4", n)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run = %v", err)
		}
	})
}

func TestSamplerClose(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	src := &flaky{inner: &None{}}
	cfg := DefaultConfig()
	cfg.Source, cfg.Registerer = src, reg
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The same registry refuses a second sampler while the first is open...
	cfg2 := cfg
	cfg2.Source = &None{}
	if _, err := New(cfg2); err == nil {
		t.Fatal("duplicate registration accepted")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n := src.closes.Load(); n != 1 {
		t.Fatalf("source closed %d times, want 1", n)
	}
	// ...and accepts one once it is closed.
	s2, err := New(cfg2)
	if err != nil {
		t.Fatalf("after Close: %v", err)
	}
	_ = s2.Close()
}

func TestNewValidates(t *testing.T) {
	if _, err := New(Config{Interval: time.Second}); !errors.Is(err, ErrConfig) {
		t.Errorf("no source: %v", err)
	}
	if _, err := New(Config{Source: &None{}}); !errors.Is(err, ErrConfig) {
		t.Errorf("zero interval: %v", err)
	}
}
