package gpu

import (
	"errors"
	"time"
)

// Vendors reported in Device.Vendor.
const (
	VendorNVIDIA = "nvidia"
	VendorSim    = "sim"
)

var (
	// ErrClosed is returned by a Source read after Close.
	ErrClosed = errors.New("gpu: closed")
	// ErrConfig means a configuration was invalid.
	ErrConfig = errors.New("gpu: invalid config")
)

// Device is one GPU's figures at a moment. Figures a device does not support are zero.
type Device struct {
	Index           int
	Name            string
	PowerWatts      float64
	PowerLimitWatts float64 // the enforced limit
	TempC           float64
	MemTotalBytes   uint64
	MemUsedBytes    uint64
	UtilPercent     float64 // 0..100, share of time a kernel ran
	Vendor          string
}

// Reading is every GPU of the host at a moment.
type Reading struct {
	Devices []Device
	At      time.Time
}

// PowerWatts is the host's total draw.
func (r Reading) PowerWatts() float64 {
	var w float64
	for _, d := range r.Devices {
		w += d.PowerWatts
	}
	return w
}

// PowerLimitWatts is the sum of the enforced limits: the host's power cap.
func (r Reading) PowerLimitWatts() float64 {
	var w float64
	for _, d := range r.Devices {
		w += d.PowerLimitWatts
	}
	return w
}

// PowerHeadroom is 1 − draw/cap, clamped to 0..1; 1 when the cap is unknown, so a host
// without telemetry is not penalised.
func (r Reading) PowerHeadroom() float64 {
	limit := r.PowerLimitWatts()
	if limit <= 0 {
		return 1
	}
	return min(max(1-r.PowerWatts()/limit, 0), 1)
}

// MaxTempC is the hottest device's temperature; 0 with no devices.
func (r Reading) MaxTempC() float64 {
	var t float64
	for _, d := range r.Devices {
		t = max(t, d.TempC)
	}
	return t
}

// MemTotalBytes is the VRAM of all devices.
func (r Reading) MemTotalBytes() uint64 {
	var b uint64
	for _, d := range r.Devices {
		b += d.MemTotalBytes
	}
	return b
}

// MemUsedBytes is the VRAM in use on all devices.
func (r Reading) MemUsedBytes() uint64 {
	var b uint64
	for _, d := range r.Devices {
		b += d.MemUsedBytes
	}
	return b
}

// MaxDeviceMemBytes is the largest single card's VRAM: what a model that must fit on one card
// is checked against.
func (r Reading) MaxDeviceMemBytes() uint64 {
	var b uint64
	for _, d := range r.Devices {
		b = max(b, d.MemTotalBytes)
	}
	return b
}

// Source gives readings of the host's GPUs.
type Source interface {
	Read() (Reading, error)
	Close() error
}

// None is the Source of a host without GPU telemetry: readings have no devices.
type None struct {
	// Reason says why there is no telemetry (for the one log line the node writes).
	Reason string
}

var _ Source = (*None)(nil)

// Read returns an empty reading stamped now.
func (n *None) Read() (Reading, error) { return Reading{At: time.Now()}, nil }

// Close does nothing.
func (n *None) Close() error { return nil }
