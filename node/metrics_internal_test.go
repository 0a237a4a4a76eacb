package node

import (
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/admit"
)

// TestSLOsAreBucketEdges pins that the share of requests within each class's TTFT and TPOT
// target reads off the latency histograms: every default SLO is a bucket edge, and so is a
// configured one.
func TestSLOsAreBucketEdges(t *testing.T) {
	custom := admit.Config{SLO: admit.SLOConfig{Normal: admit.ClassSLO{
		TTFT: admit.Duration(1500 * time.Millisecond), TPOT: admit.Duration(80 * time.Millisecond)}}}
	for _, tt := range []struct {
		name  string
		admit admit.Config
		want  admit.SLOConfig
	}{
		{"defaults", admit.Config{}, admit.DefaultConfig().SLO},
		{"configured", custom, custom.WithDefaults().SLO},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Name, cfg.Standalone, cfg.GPU, cfg.Admit = "edges", true, "none", tt.admit
			n, err := New(cfg) // New binds nothing and starts no goroutine
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = n.Shutdown(t.Context()) })
			edges := bucketEdges(t, n.Registry())
			for class, c := range map[string]admit.ClassSLO{"high": tt.want.High, "normal": tt.want.Normal, "low": tt.want.Low} {
				for _, h := range []struct {
					family string
					target admit.Duration
				}{{"kvmesh_request_ttft_seconds", c.TTFT}, {"kvmesh_request_tpot_seconds", c.TPOT}} {
					if h.target == 0 {
						continue // no target (the low class's TPOT)
					}
					if s := time.Duration(h.target).Seconds(); !slices.Contains(edges[h.family], s) {
						t.Errorf("%s: the %s class's target %vs is not a bucket edge of %v", h.family, class, s, edges[h.family])
					}
				}
			}
		})
	}
}

// bucketEdges returns the upper bounds of every histogram in reg, by family.
func bucketEdges(t *testing.T, reg *prometheus.Registry) map[string][]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			for _, b := range m.GetHistogram().GetBucket() {
				out[f.GetName()] = append(out[f.GetName()], b.GetUpperBound())
			}
		}
	}
	return out
}
