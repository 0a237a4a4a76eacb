package gpu

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config configures a Sampler.
type Config struct {
	Source     Source        // required; the Sampler owns it and closes it
	Interval   time.Duration // between reads
	Logger     *slog.Logger  // nil discards
	Registerer prometheus.Registerer
}

// DefaultConfig reads every second, the cadence of the node's state record.
func DefaultConfig() Config {
	return Config{Interval: time.Second}
}

// Sampler reads a Source on an interval and keeps the latest good reading.
type Sampler struct {
	cfg Config
	log *slog.Logger
	m   *metrics

	mu      sync.Mutex
	latest  Reading
	lastErr error
	devices int // label values currently exported

	closeOnce sync.Once
	closeErr  error
}

// New validates cfg and registers the metrics. It does no I/O and starts nothing.
func New(cfg Config) (*Sampler, error) {
	if cfg.Source == nil {
		return nil, fmt.Errorf("%w: sampler needs a source", ErrConfig)
	}
	if cfg.Interval <= 0 {
		return nil, fmt.Errorf("%w: sampler interval must be > 0", ErrConfig)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Sampler{cfg: cfg, log: log, m: m}, nil
}

// Run reads at once, then every Interval, until ctx is done; it returns nil then.
func (s *Sampler) Run(ctx context.Context) error {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		_, _ = s.Sample()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Sample reads the Source once and updates Latest and the metrics. On error the previous
// reading is kept; the error is logged when it starts and when it clears, not on every read.
func (s *Sampler) Sample() (Reading, error) {
	r, err := s.cfg.Source.Read()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.m.readErrors.Inc()
		if s.lastErr == nil {
			s.log.Warn("gpu read failed; keeping the previous reading", "err", err)
		}
		s.lastErr = err
		return Reading{}, err
	}
	if s.lastErr != nil {
		s.log.Info("gpu reads recovered")
	}
	s.lastErr = nil
	s.latest = r
	s.exportLocked(r)
	return r, nil
}

// Latest is the most recent good reading; the zero Reading before the first.
func (s *Sampler) Latest() Reading {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.latest
}

// Err is the latest read's error, nil after a good read.
func (s *Sampler) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastErr
}

func (s *Sampler) exportLocked(r Reading) {
	if len(r.Devices) != s.devices {
		// Drop label values of devices that went away, so no gauge is left frozen.
		s.m.reset()
		s.devices = len(r.Devices)
	}
	for _, d := range r.Devices {
		g := strconv.Itoa(d.Index)
		s.m.power.WithLabelValues(g).Set(d.PowerWatts)
		s.m.limit.WithLabelValues(g).Set(d.PowerLimitWatts)
		s.m.temp.WithLabelValues(g).Set(d.TempC)
		s.m.memUsed.WithLabelValues(g).Set(float64(d.MemUsedBytes))
		s.m.memTotal.WithLabelValues(g).Set(float64(d.MemTotalBytes))
		s.m.util.WithLabelValues(g).Set(d.UtilPercent / 100)
	}
}

// Close closes the Source and unregisters the metrics; later calls return the first result.
func (s *Sampler) Close() error {
	s.closeOnce.Do(func() {
		s.m.unregister()
		s.closeErr = s.cfg.Source.Close()
	})
	return s.closeErr
}

type metrics struct {
	reg                                         prometheus.Registerer
	power, limit, temp, memUsed, memTotal, util *prometheus.GaugeVec
	readErrors                                  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"gpu"})
	}
	m := &metrics{
		reg:      reg,
		power:    gauge("kvmesh_gpu_power_watts", "GPU power draw."),
		limit:    gauge("kvmesh_gpu_power_limit_watts", "GPU enforced power limit."),
		temp:     gauge("kvmesh_gpu_temperature_celsius", "GPU core temperature."),
		memUsed:  gauge("kvmesh_gpu_memory_used_bytes", "GPU memory in use."),
		memTotal: gauge("kvmesh_gpu_memory_total_bytes", "GPU memory installed."),
		util:     gauge("kvmesh_gpu_utilization_ratio", "Share of time a kernel ran on the GPU, 0..1."),
		readErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_gpu_read_errors_total", Help: "Failed GPU telemetry reads.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	var done []prometheus.Collector
	for _, c := range m.collectors() {
		if err := reg.Register(c); err != nil {
			for _, d := range done {
				reg.Unregister(d)
			}
			return nil, fmt.Errorf("gpu: registering metrics: %w", err)
		}
		done = append(done, c)
	}
	return m, nil
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.power, m.limit, m.temp, m.memUsed, m.memTotal, m.util, m.readErrors}
}

func (m *metrics) reset() {
	for _, v := range []*prometheus.GaugeVec{m.power, m.limit, m.temp, m.memUsed, m.memTotal, m.util} {
		v.Reset()
	}
}

func (m *metrics) unregister() {
	if m.reg == nil {
		return
	}
	for _, c := range m.collectors() {
		m.reg.Unregister(c)
	}
}
