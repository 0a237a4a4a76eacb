package console

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Families are the metric families the page reads, by name: admission verdicts (by reason,
// role pool and priority class), the waiting room, SLO attainment, forwards, migrations,
// ejections and carbon. Others in the registry are not sent.
var Families = []string{
	"kvmesh_admission_decisions_total",
	"kvmesh_admission_pool_decisions_total",
	"kvmesh_admission_class_decisions_total",
	"kvmesh_admission_queue_requests",
	"kvmesh_admission_queue_prefill_tokens",
	"kvmesh_admission_queue_token_cap",
	"kvmesh_slo_requests_total",
	"kvmesh_slo_met_total",
	"kvmesh_requests_received_total",
	"kvmesh_forward_attempts_total",
	"kvmesh_migrations_total",
	"kvmesh_forward_peer_ejections_total",
	"kvmesh_carbon_rerouted_total",
	"kvmesh_carbon_deferred_total",
	"kvmesh_carbon_intensity",
	"kvmesh_carbon_fail_mode_active",
}

// Sample is one series of a family: its labels and value (a counter's or a gauge's).
type Sample struct {
	Labels map[string]string `json:"labels,omitempty"`
	Value  float64           `json:"value"`
}

// gather reads the Families g holds; a family g lacks (carbon off) is absent.
func gather(g prometheus.Gatherer) (map[string][]Sample, error) {
	mfs, err := g.Gather()
	if err != nil && len(mfs) == 0 {
		return nil, err
	}
	want := make(map[string]bool, len(Families))
	for _, f := range Families {
		want[f] = true
	}
	out := make(map[string][]Sample, len(Families))
	for _, mf := range mfs {
		if !want[mf.GetName()] {
			continue
		}
		ss := make([]Sample, 0, len(mf.GetMetric()))
		for _, m := range mf.GetMetric() {
			ss = append(ss, Sample{Labels: labels(m), Value: value(m)})
		}
		out[mf.GetName()] = ss
	}
	return out, nil
}

func labels(m *dto.Metric) map[string]string {
	if len(m.GetLabel()) == 0 {
		return nil
	}
	l := make(map[string]string, len(m.GetLabel()))
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return 0
}
