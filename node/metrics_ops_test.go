package node_test

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/agent"
	"github.com/kvmesh/kvmesh/carbon"
	"github.com/kvmesh/kvmesh/carbon/provider"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet"
)

// TestMetricsPassTheLinter scrapes live nodes' /metrics over HTTP, one on the embedded engine
// with agent windows and carbon on and one in front of a kvmesh engine, after a request, and
// holds the text to Prometheus's linter (promlint, what promtool check metrics runs), and to
// promtool itself when it is on PATH. vLLM's colon names stay on the engine's own /metrics,
// where the node in front of it reads them.
func TestMetricsPassTheLinter(t *testing.T) {
	t.Run("embedded", func(t *testing.T) {
		tn := startNet(t, 1, func(i int, cfg *node.Config) {
			ac := agent.DefaultConfig()
			cfg.Agents = &ac
			cfg.Carbon = &node.CarbonConfig{
				Provider: provider.Config{Kind: provider.KindStatic, StaticIntensity: 100},
				Tracker:  carbon.DefaultConfig(),
			}
		})
		url := tn.URLs()[0]
		readAll(t, post(t, url, "/v1/chat/completions", chatBody("lint", 4, false), nil))
		lintMetrics(t, adminGet(t, url+"/metrics"))
	})
	t.Run("external", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		tn, err := testnet.Start(ctx, testnet.Config{Nodes: 1, Fast: true, Engines: testnet.EnginesExternal,
			Configure: func(i int, cfg *node.Config) { cfg.Sim.TimeScale = 50 }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tn.Close() })
		url := tn.URLs()[0]
		if b := readAll(t, post(t, url, "/v1/chat/completions", chatBody("lint", 4, false), nil)); !bytes.Contains(b, []byte(`"usage"`)) {
			t.Fatalf("no completion: %s", b)
		}
		lintMetrics(t, adminGet(t, url+"/metrics"))
		if engine := adminGet(t, tn.EngineURLs()[0]+"/metrics"); !bytes.Contains(engine, []byte("\nvllm:kv_cache_usage_perc ")) {
			t.Error("the engine's /metrics lacks vllm:kv_cache_usage_perc, which the node in front of it reads")
		}
	})
}

// lintMetrics fails for every linter problem in a /metrics text, and for any vllm:* family.
func lintMetrics(t *testing.T, text []byte) {
	t.Helper()
	if bytes.Contains(text, []byte("vllm:")) {
		t.Error("a node's /metrics carries vllm:* families")
	}
	problems, err := promlint.New(bytes.NewReader(text)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("KVMESH_REQUIRE_PROMTOOL") != "" { // CI installs it
			t.Fatal("promtool is not on PATH and KVMESH_REQUIRE_PROMTOOL is set")
		}
		t.Log("promtool is not on PATH: skipping promtool check metrics (promlint ran)")
		return
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(text)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}

// TestIdleNodeExportsZeroSeries pins that a fresh node's /metrics has, at 0, the series of
// every known label value a dashboard sums or divides by: the waiting room's named bands, the
// goodput classes, the forward results, the migration outcomes, both transport directions, the
// engine's load.
func TestIdleNodeExportsZeroSeries(t *testing.T) {
	tn := startNet(t, 1, nil)
	text := string(adminGet(t, tn.URLs()[0]+"/metrics"))
	var want []string
	for _, prio := range []string{"10", "0", "-10"} {
		want = append(want, `kvmesh_admission_queue_requests{priority="`+prio+`"} 0`,
			`kvmesh_admission_queue_prefill_tokens{priority="`+prio+`"} 0`)
	}
	for _, class := range []string{"high", "normal", "low"} {
		want = append(want, `kvmesh_slo_requests_total{class="`+class+`"} 0`, `kvmesh_slo_met_total{class="`+class+`"} 0`)
	}
	for _, r := range []string{"local", "accepted", "refused", "unreachable", "owner_failed", "no_address"} {
		want = append(want, `kvmesh_forward_attempts_total{result="`+r+`"} 0`)
	}
	for _, o := range []string{"completed", "failed", "refused"} {
		for _, c := range []string{"engine", "owner"} {
			want = append(want, `kvmesh_migrations_total{cause="`+c+`",outcome="`+o+`"} 0`)
		}
	}
	want = append(want, `kvmesh_engine_requests_total{origin="local"} 0`, `kvmesh_engine_requests_total{origin="peer"} 0`,
		`kvmesh_transport_connections{direction="in"} 0`, `kvmesh_transport_connections{direction="out"} 0`,
		"kvmesh_engine_requests_running 0", "kvmesh_engine_requests_waiting 0", "kvmesh_engine_kv_use_ratio 0",
		"kvmesh_engine_prefix_hit_ratio 0", "kvmesh_request_tpot_seconds_count 0")
	for _, w := range want {
		if !strings.Contains(text, "\n"+w+"\n") {
			t.Errorf("an idle node's /metrics lacks %s", w)
		}
	}
	if !strings.Contains(text, "\nkvmesh_build_info{") {
		t.Error("no kvmesh_build_info")
	}
}

// TestAdminPathsNeedAKey pins the admin rule on the API listener: with a key file, /metrics,
// /v1/mesh/peers and the model list (as vLLM with --api-key guards every /v1 path) answer any
// valid key and refuse a missing or unknown one with the client API's 401; the probes stay
// open for load balancers.
func TestAdminPathsNeedAKey(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte(admit.HashKey("sk-tenant")+" tenant 1 100\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tn := startNet(t, 1, func(i int, cfg *node.Config) { cfg.APIKeysFile = keys })
	url := tn.URLs()[0]
	for _, path := range []string{"/metrics", "/v1/mesh/peers", "/v1/models", "/v1/models/" + model} {
		for _, key := range []string{"", "sk-wrong"} {
			status, body := getWithKey(t, url+path, key)
			if e := decodeError(t, body); status != http.StatusUnauthorized || e.Error.Code != "invalid_api_key" {
				t.Errorf("%s with key %q: %d %s, want 401 invalid_api_key", path, key, status, body)
			}
		}
		// A rate-limited key reads them as often as it likes: the check charges nothing.
		for range 3 {
			if status, body := getWithKey(t, url+path, "sk-tenant"); status != http.StatusOK {
				t.Errorf("%s with a valid key: %d %s", path, status, body)
			}
		}
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if status, body := getWithKey(t, url+path, ""); status != http.StatusOK {
			t.Errorf("%s without a key: %d %s", path, status, body)
		}
	}
}

// TestAdminListenerServesWithoutAKey pins --admin-addr: the admin listener serves the metrics,
// the mesh view and the probes to anyone and nothing else, and the API listener then asks a
// key for the admin paths even without a key file.
func TestAdminListenerServesWithoutAKey(t *testing.T) {
	tn := startNet(t, 1, func(i int, cfg *node.Config) { cfg.AdminAddr = "127.0.0.1:0" })
	url, admin := tn.URLs()[0], "http://"+tn.Nodes[0].AdminAddr()
	for _, path := range []string{"/metrics", "/v1/mesh/peers", "/healthz", "/readyz"} {
		if status, body := getWithKey(t, admin+path, ""); status != http.StatusOK {
			t.Errorf("admin %s: %d %s", path, status, body)
		}
	}
	if status, _ := getWithKey(t, admin+"/v1/models", ""); status != http.StatusNotFound {
		t.Errorf("admin /v1/models: %d, want 404", status)
	}
	if status, body := getWithKey(t, url+"/v1/models", ""); status != http.StatusOK {
		t.Errorf("API listener /v1/models without a key file: %d %s, want 200 as without --admin-addr", status, body)
	}
	for _, path := range []string{"/metrics", "/v1/mesh/peers"} {
		if status, body := getWithKey(t, url+path, ""); status != http.StatusUnauthorized {
			t.Errorf("API listener %s without a key file: %d %s, want 401", path, status, body)
		}
	}
	if status, body := getWithKey(t, url+"/readyz", ""); status != http.StatusOK {
		t.Errorf("API listener /readyz: %d %s", status, body)
	}
}
