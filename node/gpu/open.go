package gpu

import (
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Modes accepted by Open (the --gpu values).
const (
	ModeAuto = "auto"
	ModeNVML = "nvml"
	ModeNone = "none"
	ModeSim  = "sim"
)

// OpenConfig carries what Open may need besides the mode.
type OpenConfig struct {
	// NVML is the library to use; nil means nvml.New() (the real libnvidia-ml.so).
	NVML nvml.Interface
	// Sim configures mode "sim"; the zero value means DefaultSimConfig (with no load).
	Sim SimConfig
}

// Open returns the Source for mode: nvml, none, sim, or auto ("" too), which is nvml when the
// library loads and sees at least one device, else a *None whose Reason says why. Opening
// nvml loads the library and initialises it.
func Open(mode string, cfg OpenConfig) (Source, error) {
	mode = strings.ToLower(strings.TrimSpace(mode))
	lib := cfg.NVML
	if lib == nil && (mode == ModeNVML || mode == ModeAuto || mode == "") {
		lib = nvml.New()
	}
	switch mode {
	case ModeNVML:
		return OpenNVML(lib)
	case ModeNone:
		return &None{Reason: "gpu telemetry disabled (--gpu none)"}, nil
	case ModeSim:
		return NewSim(cfg.Sim)
	case ModeAuto, "":
		n, err := OpenNVML(lib)
		if err != nil {
			return &None{Reason: err.Error()}, nil
		}
		if n.Devices() == 0 {
			_ = n.Close()
			return &None{Reason: "gpu: nvml sees no devices"}, nil
		}
		return n, nil
	}
	return nil, fmt.Errorf("%w: gpu mode %q: want nvml, none, sim or auto", ErrConfig, mode)
}
