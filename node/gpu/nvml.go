package gpu

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVML reads every device through go-nvml. Device handles and names are taken once at open:
// devices do not come and go while a driver is loaded.
type NVML struct {
	lib   nvml.Interface
	devs  []nvml.Device
	names []string

	mu     sync.Mutex // NVML itself is thread-safe; this orders Read against Close
	closed bool
}

var _ Source = (*NVML)(nil)

// OpenNVML initialises NVML through lib (nvml.New() in production, a go-nvml mock in tests)
// and enumerates the devices. The caller must Close it, which shuts NVML down.
func OpenNVML(lib nvml.Interface) (*NVML, error) {
	if lib == nil {
		return nil, fmt.Errorf("%w: nil nvml interface", ErrConfig)
	}
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("gpu: nvml init: %w", ret)
	}
	n := &NVML{lib: lib}
	if err := n.enumerate(); err != nil {
		lib.Shutdown()
		return nil, err
	}
	return n, nil
}

func (n *NVML) enumerate() error {
	count, ret := n.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("gpu: nvml device count: %w", ret)
	}
	for i := range count {
		d, ret := n.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("gpu: nvml device %d handle: %w", i, ret)
		}
		name, ret := d.GetName()
		if ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_SUPPORTED {
			return fmt.Errorf("gpu: nvml device %d name: %w", i, ret)
		}
		n.devs = append(n.devs, d)
		n.names = append(n.names, name)
	}
	return nil
}

// Devices is the number of devices found at open.
func (n *NVML) Devices() int { return len(n.devs) }

// Read reads every device. A figure the device does not support stays zero; any other NVML
// error fails the whole read (errors.Is matches the nvml.Return, e.g. nvml.ERROR_GPU_IS_LOST).
func (n *NVML) Read() (Reading, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return Reading{}, ErrClosed
	}
	r := Reading{Devices: make([]Device, 0, len(n.devs)), At: time.Now()}
	for i, d := range n.devs {
		dev, err := readDevice(i, n.names[i], d)
		if err != nil {
			return Reading{}, err
		}
		r.Devices = append(r.Devices, dev)
	}
	return r, nil
}

func readDevice(i int, name string, d nvml.Device) (Device, error) {
	dev := Device{Index: i, Name: name, Vendor: VendorNVIDIA}
	var errs []error
	check := func(call string, ret nvml.Return) bool {
		if ret == nvml.SUCCESS {
			return true
		}
		if ret != nvml.ERROR_NOT_SUPPORTED {
			errs = append(errs, fmt.Errorf("gpu: nvml device %d %s: %w", i, call, ret))
		}
		return false
	}
	if mw, ret := d.GetPowerUsage(); check("power usage", ret) {
		dev.PowerWatts = float64(mw) / 1000
	}
	if mw, ret := d.GetEnforcedPowerLimit(); check("enforced power limit", ret) {
		dev.PowerLimitWatts = float64(mw) / 1000
	}
	if c, ret := d.GetTemperature(nvml.TEMPERATURE_GPU); check("temperature", ret) {
		dev.TempC = float64(c)
	}
	if m, ret := d.GetMemoryInfo(); check("memory info", ret) {
		dev.MemTotalBytes, dev.MemUsedBytes = m.Total, m.Used
	}
	if u, ret := d.GetUtilizationRates(); check("utilization", ret) {
		dev.UtilPercent = float64(u.Gpu)
	}
	if len(errs) > 0 {
		return Device{}, errors.Join(errs...)
	}
	return dev, nil
}

// Close shuts NVML down; later calls do nothing.
func (n *NVML) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	if ret := n.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("gpu: nvml shutdown: %w", ret)
	}
	return nil
}
