package gpu

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// h100Host is go-nvml's 8×H100 SXM mock with telemetry: GPU i draws 100+50i W of a 700 W
// limit, runs at 40+i °C and 10i % utilisation, and uses (i+1) GiB.
func h100Host(t testing.TB) *server.Server {
	t.Helper()
	s := dgxh100.New()
	for i, d := range s.Devices {
		dev := d.(*server.Device)
		dev.MemoryInfo.Used = uint64(i+1) << 30
		dev.MemoryInfo.Free = dev.MemoryInfo.Total - dev.MemoryInfo.Used
		dev.GetPowerUsageFunc = func() (uint32, nvml.Return) { return uint32(100_000 + 50_000*i), nvml.SUCCESS }
		dev.GetEnforcedPowerLimitFunc = func() (uint32, nvml.Return) { return 700_000, nvml.SUCCESS }
		dev.GetTemperatureFunc = func(s nvml.TemperatureSensors) (uint32, nvml.Return) {
			if s != nvml.TEMPERATURE_GPU {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return uint32(40 + i), nvml.SUCCESS
		}
		dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			return nvml.Utilization{Gpu: uint32(10 * i), Memory: 5}, nvml.SUCCESS
		}
	}
	return s
}

func openMock(t *testing.T, s *server.Server) *NVML {
	t.Helper()
	n, err := OpenNVML(s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

func TestNVMLReadH100(t *testing.T) {
	n := openMock(t, h100Host(t))
	r, err := n.Read()
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Devices) != 8 || r.At.IsZero() {
		t.Fatalf("got %d devices at %v, want 8", len(r.Devices), r.At)
	}
	for i, d := range r.Devices {
		want := Device{
			Index: i, Name: "NVIDIA H100 80GB HBM3",
			PowerWatts: 100 + 50*float64(i), PowerLimitWatts: 700, TempC: 40 + float64(i),
			MemTotalBytes: 80 << 30, MemUsedBytes: uint64(i+1) << 30,
			UtilPercent: 10 * float64(i), Vendor: VendorNVIDIA,
		}
		if d != want {
			t.Errorf("device %d = %+v\nwant %+v", i, d, want)
		}
	}
	// Aggregates: 8×100 + 50·(0+…+7) = 2200 W of 5600 W; hottest 47 °C; 36 GiB of 640 GiB.
	if got := r.PowerWatts(); got != 2200 {
		t.Errorf("PowerWatts = %v", got)
	}
	if got := r.PowerLimitWatts(); got != 5600 {
		t.Errorf("PowerLimitWatts = %v", got)
	}
	if got, want := r.PowerHeadroom(), 1-2200.0/5600; math.Abs(got-want) > 1e-12 {
		t.Errorf("PowerHeadroom = %v, want %v", got, want)
	}
	if got := r.MaxTempC(); got != 47 {
		t.Errorf("MaxTempC = %v", got)
	}
	if got := r.MemTotalBytes(); got != 640<<30 {
		t.Errorf("MemTotalBytes = %v", got)
	}
	if got := r.MemUsedBytes(); got != 36<<30 {
		t.Errorf("MemUsedBytes = %v", got)
	}
	if got := r.MaxDeviceMemBytes(); got != 80<<30 {
		t.Errorf("MaxDeviceMemBytes = %v", got)
	}
}

func TestNVMLErrors(t *testing.T) {
	t.Run("not supported leaves zero", func(t *testing.T) {
		s := h100Host(t)
		s.Devices[3].(*server.Device).GetPowerUsageFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
		r, err := openMock(t, s).Read()
		if err != nil {
			t.Fatal(err)
		}
		if r.Devices[3].PowerWatts != 0 || r.Devices[3].TempC != 43 || r.Devices[4].PowerWatts != 300 {
			t.Fatalf("devices 3,4 = %+v %+v", r.Devices[3], r.Devices[4])
		}
	})
	t.Run("lost gpu fails the read", func(t *testing.T) {
		s := h100Host(t)
		s.Devices[5].(*server.Device).GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) {
			return 0, nvml.ERROR_GPU_IS_LOST
		}
		_, err := openMock(t, s).Read()
		if !errors.Is(err, nvml.ERROR_GPU_IS_LOST) || !strings.Contains(err.Error(), "device 5 temperature") {
			t.Fatalf("err = %v, want device 5 ERROR_GPU_IS_LOST", err)
		}
	})
	t.Run("init fails", func(t *testing.T) {
		s := h100Host(t)
		s.InitFunc = func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }
		if _, err := OpenNVML(s); !errors.Is(err, nvml.ERROR_DRIVER_NOT_LOADED) {
			t.Fatalf("err = %v", err)
		}
		if n := len(s.Interface.ShutdownCalls()); n != 0 {
			t.Fatalf("Shutdown called %d times after a failed Init", n)
		}
	})
	t.Run("enumeration fails shuts down", func(t *testing.T) {
		s := h100Host(t)
		s.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
		if _, err := OpenNVML(s); !errors.Is(err, nvml.ERROR_UNKNOWN) {
			t.Fatalf("err = %v", err)
		}
		if n := len(s.Interface.ShutdownCalls()); n != 1 {
			t.Fatalf("Shutdown called %d times, want 1", n)
		}
	})
	t.Run("nil interface", func(t *testing.T) {
		if _, err := OpenNVML(nil); !errors.Is(err, ErrConfig) {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestNVMLCloseTwice(t *testing.T) {
	s := h100Host(t)
	n, err := OpenNVML(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if c := len(s.Interface.ShutdownCalls()); c != 1 {
		t.Fatalf("Shutdown called %d times, want 1", c)
	}
	if _, err := n.Read(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Read after Close = %v", err)
	}
}

func TestOpen(t *testing.T) {
	t.Run("auto without driver is none", func(t *testing.T) {
		// This machine has no libnvidia-ml.so: the real library must fail to load, not panic.
		src, err := Open(ModeAuto, OpenConfig{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = src.Close() })
		n, ok := src.(*None)
		if !ok {
			t.Skipf("an NVML library loaded here (%T); the no-driver path cannot be checked", src)
		}
		if !strings.Contains(n.Reason, "ERROR_LIBRARY_NOT_FOUND") {
			t.Fatalf("reason %q does not say the library was not found", n.Reason)
		}
		r, err := src.Read()
		if err != nil || len(r.Devices) != 0 || r.At.IsZero() {
			t.Fatalf("none read = %+v, %v", r, err)
		}
	})
	t.Run("nvml without driver is an error", func(t *testing.T) {
		src, err := Open(ModeNVML, OpenConfig{})
		if err == nil {
			_ = src.Close()
			t.Skip("an NVML library loaded here")
		}
		if !errors.Is(err, nvml.ERROR_LIBRARY_NOT_FOUND) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("auto with mock is nvml", func(t *testing.T) {
		src, err := Open("", OpenConfig{NVML: h100Host(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = src.Close() })
		if n, ok := src.(*NVML); !ok || n.Devices() != 8 {
			t.Fatalf("got %T", src)
		}
	})
	t.Run("auto with no devices is none", func(t *testing.T) {
		s := h100Host(t)
		s.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.SUCCESS }
		src, err := Open(ModeAuto, OpenConfig{NVML: s})
		if _, ok := src.(*None); err != nil || !ok {
			t.Fatalf("got %T, %v", src, err)
		}
		if c := len(s.Interface.ShutdownCalls()); c != 1 {
			t.Fatalf("Shutdown called %d times, want 1", c)
		}
	})
	t.Run("none and sim", func(t *testing.T) {
		for mode, want := range map[string]string{ModeNone: "*gpu.None", ModeSim: "*gpu.Sim"} {
			src, err := Open(mode, OpenConfig{})
			if err != nil {
				t.Fatal(err)
			}
			if got := typeName(src); got != want {
				t.Errorf("Open(%s) = %s, want %s", mode, got, want)
			}
		}
	})
	t.Run("unknown mode", func(t *testing.T) {
		if _, err := Open("amd", OpenConfig{}); !errors.Is(err, ErrConfig) {
			t.Fatalf("err = %v", err)
		}
	})
}

func typeName(v any) string {
	switch v.(type) {
	case *None:
		return "*gpu.None"
	case *Sim:
		return "*gpu.Sim"
	case *NVML:
		return "*gpu.NVML"
	}
	return "?"
}
