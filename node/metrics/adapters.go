package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/node/lora"
)

// Adapters are the families of LoRA adapter loads on demand, registered whether or not an
// adapter source is set.
type Adapters struct {
	Loads     *prometheus.CounterVec // outcome: lora.Outcome*
	Latency   prometheus.Histogram
	Evictions prometheus.Counter
}

// NewAdapters builds the adapter loads' families and registers them on reg (nil: none).
func NewAdapters(reg prometheus.Registerer) *Adapters {
	m := &Adapters{
		Loads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_adapter_loads_total", Help: "LoRA adapter loads on demand through the engine's runtime API, by outcome (loaded, failed, timeout).",
		}, []string{"outcome"}),
		Latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kvmesh_adapter_load_seconds", Help: "Time a LoRA adapter load on demand took, the unload that made room included.",
			Buckets: []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}),
		Evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_adapter_evictions_total", Help: "LoRA adapters unloaded, least recently used first, to make room for a load on demand.",
		}),
	}
	for _, o := range []string{lora.OutcomeLoaded, lora.OutcomeFailed, lora.OutcomeTimeout} {
		m.Loads.WithLabelValues(o)
	}
	if reg != nil {
		reg.MustRegister(m.Loads, m.Latency, m.Evictions)
	}
	return m
}
