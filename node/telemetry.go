package node

import (
	"fmt"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/node/gpu"
	"github.com/kvmesh/kvmesh/node/grid"
)

// buildTelemetry opens the GPU source and the grid signal (node/grid). The sim GPU follows the
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
	g, err := grid.New(grid.Config{Provider: cc.Provider, Tracker: cc.Tracker, FetchTimeout: cc.FetchTimeout,
		Registerer: n.reg, Logger: n.log})
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	n.grid, n.carbon = g, g.Tracker()
	return nil
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
