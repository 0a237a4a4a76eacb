// Package gpu reads power draw, enforced power limit, temperature, VRAM and utilisation of the
// host's GPUs, for the node's state record and for routing (power headroom, thermal limits,
// VRAM as a capability).
//
// It is the only kvmesh package with cgo: NVML is reached through go-nvml, which loads
// libnvidia-ml.so at run time. Build with CGO_CFLAGS=-Wno-deprecated-declarations to quiet
// go-nvml's warnings. A host without the driver still builds and runs.
//
// # Sources
//
// A Source gives Readings. Open picks one by mode:
//
//   - "nvml": every device through NVML; an error if the library does not load.
//   - "none": no GPU; readings have no devices.
//   - "sim": plausible figures derived from the node's load (Sim): power between idle and peak
//     watts, a first-order thermal model, VRAM from its config.
//   - "auto" (or ""): nvml when the library loads and sees a device, else none. The returned
//     *None carries the Reason, which the caller logs once.
//
// A Sampler reads its Source on an interval (Run), keeps the latest good Reading (Latest) and
// exports kvmesh_gpu_* metrics.
//
// # Concurrency
//
// Sources and the Sampler are safe for concurrent use. The zero values are not usable: build
// them with Open, OpenNVML, NewSim and New. Close is safe to call twice.
package gpu
