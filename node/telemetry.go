package node

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/carbon"
	"github.com/kvmesh/kvmesh/carbon/provider"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/node/gpu"
)

// buildTelemetry opens the GPU source and the carbon tracker. The sim GPU follows the
// engine's running share of its batch, so the testnet shows power and heat moving.
func (n *Node) buildTelemetry() error {
	mode := n.cfg.GPU
	oc := gpu.OpenConfig{Sim: gpu.DefaultSimConfig()}
	oc.Sim.Load = func() float64 {
		st := n.eng.State()
		if st.MaxRunning <= 0 {
			return 0
		}
		return float64(st.Running) / float64(st.MaxRunning)
	}
	src, err := gpu.Open(mode, oc)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	if none, ok := src.(*gpu.None); ok {
		n.log.Info("running without GPU telemetry", "reason", none.Reason)
	}
	sc := gpu.DefaultConfig()
	sc.Source, sc.Logger, sc.Registerer = src, n.log, n.reg
	if n.gpu, err = gpu.New(sc); err != nil {
		_ = src.Close()
		return fmt.Errorf("node: %w", err)
	}
	if n.cfg.Carbon == nil {
		return nil
	}
	cc := n.cfg.Carbon
	if n.carbonProvider, err = provider.New(cc.Provider); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	if n.carbon, err = carbon.New(cc.Tracker); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	if cc.FetchTimeout <= 0 {
		cc.FetchTimeout = 10 * time.Second
	}
	n.m.carbonMode = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvmesh_carbon_fail_mode_active",
		Help: "1 for the carbon fail mode in force now (no fresh reading), by mode; 0 while a fresh reading decides.",
	}, []string{"mode"})
	n.m.carbonIntensity = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvmesh_carbon_intensity", Help: "Latest grid carbon intensity reading (provider's unit).",
	})
	n.reg.MustRegister(n.m.carbonMode, n.m.carbonIntensity)
	return nil
}

// runCarbon polls the provider when the tracker says, until ctx ends.
func (n *Node) runCarbon(ctx context.Context) {
	for {
		now := time.Now()
		wait := n.carbon.NextPoll(now).Sub(now)
		select {
		case <-ctx.Done():
			return
		case <-time.After(max(wait, 0)):
		}
		fctx, cancel := context.WithTimeout(ctx, n.cfg.Carbon.FetchTimeout)
		r, err := n.carbonProvider.Fetch(fctx, time.Now())
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			n.carbon.RecordError(time.Now(), err)
			n.log.Warn("carbon provider", "err", err)
		} else {
			n.carbon.Record(time.Now(), r)
		}
		n.exportCarbon(time.Now())
	}
}

func (n *Node) exportCarbon(now time.Time) {
	r, st := n.carbon.Current(now)
	for _, m := range []carbon.FailMode{carbon.FailOpen, carbon.FailClosed} {
		v := 0.0
		if st.FailModeActive && st.FailMode == m {
			v = 1
		}
		n.m.carbonMode.WithLabelValues(m.String()).Set(v)
	}
	n.m.carbonIntensity.Set(r.Intensity)
}

// fillTelemetry adds the GPU and grid figures to a state record.
func (n *Node) fillTelemetry(s *gossip.State) {
	if n.gpu != nil {
		r := n.gpu.Latest()
		s.PowerWatts, s.PowerCapWatts, s.TempC = r.PowerWatts(), r.PowerLimitWatts(), r.MaxTempC()
		s.VRAMTotalBytes, s.VRAMUsedBytes = r.MaxDeviceMemBytes(), r.MemUsedBytes()
		if len(r.Devices) > 0 {
			s.GPUName, s.Vendor = r.Devices[0].Name, r.Devices[0].Vendor
		}
	}
	if n.carbon != nil {
		now := time.Now()
		r, st := n.carbon.Current(now)
		s.CarbonIntensity, s.CarbonZone = r.Intensity, r.Zone
		s.CarbonAgeSeconds = st.Age.Seconds()
		s.CarbonStale = st.FailModeActive
	}
}

// carbonDirty says whether a node's grid is over this node's carbon threshold, judged from
// its state record; without a fresh reading the configured fail mode decides.
func (n *Node) carbonDirty(s gossip.State) bool {
	if n.carbon == nil {
		return false
	}
	return n.carbon.Config().Dirty(s.CarbonIntensity, s.CarbonStale)
}
