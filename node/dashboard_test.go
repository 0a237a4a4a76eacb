package node

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

const dashboard = "../deploy/grafana/kvmesh.json"

// metricNameRE finds the kvmesh metric names in a PromQL expression.
var metricNameRE = regexp.MustCompile(`kvmesh_[a-z0-9_]+`)

// TestDashboardQueriesExportedMetrics pins deploy/grafana/kvmesh.json to the exposition: it is
// valid JSON, every panel has a datasource and at least one query, and every kvmesh metric a
// query names (a histogram's _bucket, _sum or _count by its family) is in metrics.golden, so a
// renamed or removed metric cannot leave a panel silently empty.
func TestDashboardQueriesExportedMetrics(t *testing.T) {
	data, err := os.ReadFile(dashboard)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title  string `json:"title"`
		Panels []struct {
			Title      string          `json:"title"`
			Datasource json.RawMessage `json:"datasource"`
			Targets    []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboard, err)
	}
	golden, err := os.ReadFile(metricsGolden)
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, l := range strings.Split(string(golden), "\n") {
		if name, _, ok := strings.Cut(l, " "); ok {
			exported[name] = true
		}
	}
	if len(d.Panels) == 0 {
		t.Fatalf("%s has no panels", dashboard)
	}
	for _, p := range d.Panels {
		if len(p.Datasource) == 0 || string(p.Datasource) == "null" {
			t.Errorf("panel %q has no datasource", p.Title)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no targets", p.Title)
		}
		for _, tg := range p.Targets {
			names := metricNameRE.FindAllString(tg.Expr, -1)
			if len(names) == 0 {
				t.Errorf("panel %q: query %q names no kvmesh metric", p.Title, tg.Expr)
			}
			for _, name := range names {
				family := name
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					family = strings.TrimSuffix(family, suffix)
				}
				if !exported[family] {
					t.Errorf("panel %q: %s is not in %s", p.Title, name, metricsGolden)
				}
			}
		}
	}
}
