package gpu

import (
	"fmt"
	"math"
	"sync"
	"time"
)

// SimConfig configures a simulated GPU host. Defaults model an H100 SXM 80 GB.
type SimConfig struct {
	Devices         int     // GPUs on the host, all running the same load
	Name            string  // reported device name
	IdleWatts       float64 // draw at load 0
	PeakWatts       float64 // draw at load 1
	PowerLimitWatts float64 // enforced limit reported; PeakWatts when 0
	AmbientC        float64 // temperature the card relaxes to with no power
	CPerWatt        float64 // steady-state rise over ambient per watt drawn
	TimeConstant    time.Duration
	MemTotalBytes   uint64
	// MemUsedBytes is reported as used; an engine preallocates its KV pool, so it does not
	// follow the load. 0 means 90% of MemTotalBytes (vLLM's default memory use).
	MemUsedBytes uint64
	// Load returns the engine's load, 0..1 (e.g. running/max or KV use); nil means idle.
	// Values outside 0..1 are clamped.
	Load func() float64
	// Now is the clock Read uses; nil means time.Now. ReadAt takes the time directly.
	Now func() time.Time
}

// DefaultSimConfig is one H100 SXM 80 GB: 70 W idle, 700 W peak and cap, 30 °C ambient,
// 0.08 °C/W (about 36 °C idle, 86 °C flat out), a 60 s thermal time constant.
func DefaultSimConfig() SimConfig {
	return SimConfig{
		Devices:       1,
		Name:          "Simulated NVIDIA H100 80GB HBM3",
		IdleWatts:     70,
		PeakWatts:     700,
		AmbientC:      30,
		CPerWatt:      0.08,
		TimeConstant:  60 * time.Second,
		MemTotalBytes: 80 << 30,
	}
}

// Sim derives plausible GPU figures from a load function. Temperature follows a first-order
// model: it relaxes toward AmbientC + CPerWatt·power with time constant TimeConstant, solved
// exactly over each interval between reads (power taken as constant over the interval, at
// the load seen when read), so it is stable for any read interval.
type Sim struct {
	cfg SimConfig

	mu    sync.Mutex
	last  time.Time // zero before the first read
	tempC float64
}

var _ Source = (*Sim)(nil)

// NewSim validates cfg and fills defaults for zero fields from DefaultSimConfig.
func NewSim(cfg SimConfig) (*Sim, error) {
	def := DefaultSimConfig()
	if cfg.Devices == 0 {
		cfg.Devices = def.Devices
	}
	if cfg.Name == "" {
		cfg.Name = def.Name
	}
	if cfg.IdleWatts == 0 && cfg.PeakWatts == 0 {
		cfg.IdleWatts, cfg.PeakWatts = def.IdleWatts, def.PeakWatts
	}
	if cfg.PowerLimitWatts == 0 {
		cfg.PowerLimitWatts = cfg.PeakWatts
	}
	if cfg.CPerWatt == 0 {
		cfg.CPerWatt = def.CPerWatt
	}
	if cfg.TimeConstant == 0 {
		cfg.TimeConstant = def.TimeConstant
	}
	if cfg.MemTotalBytes == 0 {
		cfg.MemTotalBytes = def.MemTotalBytes
	}
	if cfg.MemUsedBytes == 0 {
		cfg.MemUsedBytes = cfg.MemTotalBytes / 10 * 9
	}
	switch {
	case cfg.Devices < 0 || cfg.Devices > 64:
		return nil, fmt.Errorf("%w: sim devices %d outside 1..64", ErrConfig, cfg.Devices)
	case cfg.IdleWatts < 0 || cfg.PeakWatts < cfg.IdleWatts:
		return nil, fmt.Errorf("%w: sim watts need 0 ≤ idle ≤ peak", ErrConfig)
	case cfg.PowerLimitWatts < 0 || cfg.CPerWatt < 0 || cfg.TimeConstant < 0:
		return nil, fmt.Errorf("%w: sim power limit, °C per watt and time constant must be ≥ 0", ErrConfig)
	case cfg.MemUsedBytes > cfg.MemTotalBytes:
		return nil, fmt.Errorf("%w: sim memory used exceeds total", ErrConfig)
	}
	return &Sim{cfg: cfg}, nil
}

// Read is ReadAt(Now()).
func (s *Sim) Read() (Reading, error) {
	now := time.Now()
	if s.cfg.Now != nil {
		now = s.cfg.Now()
	}
	return s.ReadAt(now), nil
}

// ReadAt advances the thermal model to now and returns the host's figures. A now before the
// previous read does not move the model.
func (s *Sim) ReadAt(now time.Time) Reading {
	load := 0.0
	if s.cfg.Load != nil {
		load = s.cfg.Load()
	}
	if math.IsNaN(load) {
		load = 0
	}
	load = min(max(load, 0), 1)
	power := s.cfg.IdleWatts + (s.cfg.PeakWatts-s.cfg.IdleWatts)*load
	target := s.cfg.AmbientC + s.cfg.CPerWatt*power

	s.mu.Lock()
	if s.last.IsZero() {
		// Start as a card that has been idling, not one at ambient.
		s.tempC = s.cfg.AmbientC + s.cfg.CPerWatt*s.cfg.IdleWatts
		s.last = now
	}
	if dt := now.Sub(s.last); dt > 0 {
		decay := 0.0 // TimeConstant 0: the card reaches its target at once
		if s.cfg.TimeConstant > 0 {
			decay = math.Exp(-dt.Seconds() / s.cfg.TimeConstant.Seconds())
		}
		s.tempC = target + (s.tempC-target)*decay
		s.last = now
	}
	temp := s.tempC
	s.mu.Unlock()

	r := Reading{Devices: make([]Device, s.cfg.Devices), At: now}
	for i := range r.Devices {
		r.Devices[i] = Device{
			Index:           i,
			Name:            s.cfg.Name,
			PowerWatts:      power,
			PowerLimitWatts: s.cfg.PowerLimitWatts,
			TempC:           temp,
			MemTotalBytes:   s.cfg.MemTotalBytes,
			MemUsedBytes:    s.cfg.MemUsedBytes,
			UtilPercent:     100 * load,
			Vendor:          VendorSim,
		}
	}
	return r
}

// Close does nothing.
func (s *Sim) Close() error { return nil }
