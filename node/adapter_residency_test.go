package node_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/node"
)

// An adapter of the source resident nowhere is loaded on one node by its first request; once
// the records show it resident there, its requests from every ingress, that node's own
// included, run there rather than load it on another node serving the base model, while
// every node serving the base stays a candidate (a free slot), whether the source names the
// adapter's base model or leaves it to the engine's first.
func TestSourceAdapterRunsWhereResident(t *testing.T) {
	for _, tt := range []struct {
		name   string
		source func(t *testing.T) string
	}{
		{"base named", func(t *testing.T) string { return adapterSource(t, model, "tenant-a", "tenant-b") }},
		{"first base model", func(t *testing.T) string {
			data, _ := json.Marshal(map[string]string{"tenant-a": "/lora/tenant-a", "tenant-b": "/lora/tenant-b"})
			f := filepath.Join(t.TempDir(), "adapters.json")
			if err := os.WriteFile(f, data, 0o644); err != nil {
				t.Fatal(err)
			}
			return f
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			src := tt.source(t)
			tn := startNet(t, 3, func(i int, cfg *node.Config) {
				cfg.AdapterSource = src
				cfg.Sim.MaxLoRAs, cfg.Sim.LoRALoadTime = 4, 50*time.Millisecond
			})
			holder := runAdapter(t, tn.URLs()[0], "tenant-a").Header.Get(node.HeaderNode)
			assertAdapterLoads(t, tn.URLs(), 1)
			for _, u := range tn.URLs() {
				awaitResident(t, u, holder, "tenant-a")
			}
			for i, u := range tn.URLs() {
				for range 2 {
					resp := post(t, u, "/v1/chat/completions", chatFor("tenant-a", "hello again"), map[string]string{node.HeaderExplain: "1"})
					if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
						t.Fatalf("ingress %d: status %d: %s", i, resp.StatusCode, body)
					}
					e := resp.Header.Get(node.HeaderExplain)
					if got := resp.Header.Get(node.HeaderNode); got != holder || !strings.HasPrefix(e, holder+" ") {
						t.Errorf("ingress %d: ran on %q (candidates %s), want %q, where tenant-a is resident", i, got, e, holder)
					}
					if !strings.Contains(e, " lora=resident") || strings.Count(e, " lora=free_slot") != 2 {
						t.Errorf("ingress %d: candidates %s, want the holder resident and the other two with a free slot", i, e)
					}
				}
			}
			assertAdapterLoads(t, tn.URLs(), 1)
		})
	}
}

// assertAdapterLoads checks the adapter loads of the nodes at urls add up to want.
func assertAdapterLoads(t *testing.T, urls []string, want float64) {
	t.Helper()
	var total float64
	for _, u := range urls {
		total += metric(t, u, "kvmesh_adapter_loads_total", `outcome="loaded"`)
	}
	if total != want {
		t.Errorf("adapter loads = %v, want %v", total, want)
	}
}

// awaitResident waits until the node at url sees adapter resident on holder.
func awaitResident(t *testing.T, url, holder, adapter string) {
	t.Helper()
	poll.Until(t, 10*time.Second, url+" to see "+adapter+" resident on "+holder, func() bool {
		for _, p := range peers(t, url).Peers {
			if p.Name == holder && slices.ContainsFunc(p.Adapters, func(a gossip.Adapter) bool {
				return a.Name == adapter && a.Resident
			}) {
				return true
			}
		}
		return false
	})
}
