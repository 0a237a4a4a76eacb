package gpu

import (
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"time"
)

var t0 = time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)

// loadVar is a settable load function.
type loadVar struct{ bits atomic.Uint64 }

func (l *loadVar) set(v float64) { l.bits.Store(math.Float64bits(v)) }
func (l *loadVar) get() float64  { return math.Float64frombits(l.bits.Load()) }

func newSim(t *testing.T, load *loadVar) *Sim {
	t.Helper()
	cfg := DefaultSimConfig()
	cfg.Load = load.get
	s, err := NewSim(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSimPowerFollowsLoad(t *testing.T) {
	load := &loadVar{}
	s := newSim(t, load)
	tests := []struct {
		load, watts, util float64
	}{
		{0, 70, 0},
		{0.5, 385, 50},
		{1, 700, 100},
		{2, 700, 100},       // clamped
		{-1, 70, 0},         // clamped
		{math.NaN(), 70, 0}, // ignored
	}
	for _, tt := range tests {
		load.set(tt.load)
		d := s.ReadAt(t0).Devices[0]
		if d.PowerWatts != tt.watts || d.UtilPercent != tt.util || d.PowerLimitWatts != 700 {
			t.Errorf("load %v: %+v, want %v W, %v %%", tt.load, d, tt.watts, tt.util)
		}
		if d.MemTotalBytes != 80<<30 || d.MemUsedBytes != 72<<30 || d.Vendor != VendorSim {
			t.Errorf("load %v: memory %d/%d vendor %q", tt.load, d.MemUsedBytes, d.MemTotalBytes, d.Vendor)
		}
	}
}

func TestSimThermal(t *testing.T) {
	const tau = 60 * time.Second
	idleC := 30 + 0.08*70.0  // 35.6 °C
	peakC := 30 + 0.08*700.0 // 86 °C
	load := &loadVar{}
	s := newSim(t, load)
	now := t0
	temp := func() float64 { return s.ReadAt(now).MaxTempC() }
	if got := temp(); math.Abs(got-idleC) > 1e-9 {
		t.Fatalf("start %v °C, want idle steady state %v", got, idleC)
	}

	// Heats under load: strictly rising, never past the steady state, one time constant
	// covers 1−1/e of the gap.
	load.set(1)
	prev := temp()
	for i := 1; i <= 60; i++ {
		now = now.Add(5 * time.Second)
		got := temp()
		if got <= prev || got > peakC {
			t.Fatalf("step %d: %v °C after %v (want rising, ≤ %v)", i, got, prev, peakC)
		}
		if i == 12 { // 60 s = τ
			want := peakC - (peakC-idleC)/math.E
			if math.Abs(got-want) > 1e-6 {
				t.Fatalf("after τ: %v °C, want %v", got, want)
			}
		}
		prev = got
	}
	if math.Abs(prev-peakC) > 0.01*(peakC-idleC) {
		t.Fatalf("after 5τ: %v °C, want within 1%% of %v", prev, peakC)
	}

	// Cools when idle, toward the idle steady state, never below it.
	load.set(0)
	for range 100 {
		now = now.Add(10 * time.Second)
		got := temp()
		if got >= prev || got < idleC {
			t.Fatalf("cooling: %v °C after %v (want falling, ≥ %v)", got, prev, idleC)
		}
		prev = got
	}

	// One huge step lands on the target, and time going backwards changes nothing.
	load.set(1)
	now = now.Add(24 * time.Hour)
	if got := temp(); math.Abs(got-peakC) > 1e-9 {
		t.Fatalf("after a day at peak: %v", got)
	}
	now = now.Add(-time.Hour)
	load.set(0)
	if got := temp(); math.Abs(got-peakC) > 1e-9 {
		t.Fatalf("clock went back: %v, want unchanged %v", got, peakC)
	}
}

func TestSimUsesClock(t *testing.T) {
	now := t0
	cfg := DefaultSimConfig()
	cfg.Devices = 4
	cfg.Now = func() time.Time { return now }
	cfg.Load = func() float64 { return 1 }
	s, err := NewSim(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r1, _ := s.Read()
	now = now.Add(time.Minute)
	r2, _ := s.Read()
	if !r2.At.Equal(now) || len(r2.Devices) != 4 || r2.MaxTempC() <= r1.MaxTempC() {
		t.Fatalf("reads %+v then %+v: want 4 devices, heating with the injected clock", r1, r2)
	}
	if r2.PowerWatts() != 2800 || r2.PowerHeadroom() != 0 {
		t.Fatalf("power %v headroom %v", r2.PowerWatts(), r2.PowerHeadroom())
	}
}

func TestNewSimValidates(t *testing.T) {
	bad := map[string]SimConfig{
		"peak under idle": {IdleWatts: 300, PeakWatts: 100},
		"negative idle":   {IdleWatts: -1, PeakWatts: 100},
		"too many":        {Devices: 1000},
		"used over total": {MemTotalBytes: 1 << 30, MemUsedBytes: 2 << 30},
		"negative tau":    {TimeConstant: -time.Second},
	}
	for name, cfg := range bad {
		if _, err := NewSim(cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: err = %v, want ErrConfig", name, err)
		}
	}
}

func TestReadingEmpty(t *testing.T) {
	var r Reading
	if r.PowerWatts() != 0 || r.PowerLimitWatts() != 0 || r.PowerHeadroom() != 1 || r.MaxTempC() != 0 ||
		r.MemTotalBytes() != 0 || r.MaxDeviceMemBytes() != 0 {
		t.Fatalf("empty reading aggregates wrong: headroom %v", r.PowerHeadroom())
	}
	over := Reading{Devices: []Device{{PowerWatts: 800, PowerLimitWatts: 700}}}
	if over.PowerHeadroom() != 0 {
		t.Fatalf("over cap headroom %v, want 0", over.PowerHeadroom())
	}
}
