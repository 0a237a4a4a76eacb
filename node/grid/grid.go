package grid

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/carbon"
	"github.com/kvmesh/kvmesh/carbon/provider"
)

// DefaultFetchTimeout bounds one provider call when Config.FetchTimeout is 0.
const DefaultFetchTimeout = 10 * time.Second

// Config is a node's grid signal: where readings come from and how the tracker judges them.
type Config struct {
	Provider     provider.Config
	Tracker      carbon.Config
	FetchTimeout time.Duration // one provider call; 0: DefaultFetchTimeout
	// Registerer gets the grid's gauges; Logger the provider's failures (nil: discarded).
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Grid is a node's grid carbon signal: the tracker, polled from its provider when the tracker
// says, and the gauges of its latest reading and fail mode.
type Grid struct {
	tracker   *carbon.Tracker
	provider  carbon.Provider
	timeout   time.Duration
	log       *slog.Logger
	mode      *prometheus.GaugeVec
	intensity prometheus.Gauge
}

// New builds the provider and the tracker of cfg and registers the gauges. It does no I/O. Its
// errors are the provider's and the tracker's, as they come.
func New(cfg Config) (*Grid, error) {
	g := &Grid{timeout: cfg.FetchTimeout, log: cfg.Logger}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	var err error
	if g.provider, err = provider.New(cfg.Provider); err != nil {
		return nil, err
	}
	if g.tracker, err = carbon.New(cfg.Tracker); err != nil {
		return nil, err
	}
	if g.timeout <= 0 {
		g.timeout = DefaultFetchTimeout
	}
	g.mode = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvmesh_carbon_fail_mode_active",
		Help: "1 for the carbon fail mode in force now (no fresh reading), by mode; 0 while a fresh reading decides.",
	}, []string{"mode"})
	g.intensity = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvmesh_carbon_intensity", Help: "Latest grid carbon intensity reading (provider's unit).",
	})
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(g.mode, g.intensity)
	}
	return g, nil
}

// Tracker is the tracker the grid records its readings in.
func (g *Grid) Tracker() *carbon.Tracker { return g.tracker }

// Run polls the provider when the tracker says, until ctx ends.
func (g *Grid) Run(ctx context.Context) {
	for {
		now := time.Now()
		wait := g.tracker.NextPoll(now).Sub(now)
		select {
		case <-ctx.Done():
			return
		case <-time.After(max(wait, 0)):
		}
		fctx, cancel := context.WithTimeout(ctx, g.timeout)
		r, err := g.provider.Fetch(fctx, time.Now())
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			g.tracker.RecordError(time.Now(), err)
			g.log.Warn("carbon provider", "err", err)
		} else {
			g.tracker.Record(time.Now(), r)
		}
		g.Export(time.Now())
	}
}

// Export sets the gauges to the tracker's reading and fail mode at now.
func (g *Grid) Export(now time.Time) {
	r, st := g.tracker.Current(now)
	for _, m := range []carbon.FailMode{carbon.FailOpen, carbon.FailClosed} {
		v := 0.0
		if st.FailModeActive && st.FailMode == m {
			v = 1
		}
		g.mode.WithLabelValues(m.String()).Set(v)
	}
	g.intensity.Set(r.Intensity)
}
