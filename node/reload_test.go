package node_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/nodeconfig"
)

// TestReloadReachesTheHTTPPath pins that a reloaded admission setting decides the next request
// through a running node's API, and that /metrics reports the reload and the file in force.
func TestReloadReachesTheHTTPPath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvmesh.yaml")
	write := func(content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("admission:\n  budget: {max_max_tokens: 32}\n")
	tn := startNet(t, 1, func(i int, cfg *node.Config) {
		var err error
		if *cfg, _, err = nodeconfig.ReadConfigFile(path, *cfg); err != nil {
			t.Fatal(err)
		}
		cfg.ConfigWatch = -1 // reloaded by hand below
	})
	url := tn.URLs()[0]
	body := chatBody("hello", 64, false)
	resp := post(t, url, "/v1/chat/completions", body, nil)
	if b := readAll(t, resp); resp.StatusCode != 400 || decodeError(t, b).Error.Code != "invalid_parameter" {
		t.Fatalf("max_tokens 64 over the file's 32: status %d %s, want 400 invalid_parameter", resp.StatusCode, b)
	}
	write("admission:\n  budget: {max_max_tokens: 128}\n")
	if err := tn.Nodes[0].Reload(); err != nil {
		t.Fatal(err)
	}
	resp = post(t, url, "/v1/chat/completions", body, nil)
	if b := readAll(t, resp); resp.StatusCode != 200 {
		t.Errorf("max_tokens 64 under the reloaded 128: status %d %s, want 200", resp.StatusCode, b)
	}
	if ok := metric(t, url, "kvmesh_config_reloads_total", `result="ok"`); ok != 1 {
		t.Errorf("kvmesh_config_reloads_total{result=ok} = %v, want 1", ok)
	}
	// The hash is the file's as sha256sum prints it.
	const sum = "af4cfe8258b7d87c95487cdba23eb98ac8af14ec827b12cd8e508d51afcbc078"
	if v := metric(t, url, "kvmesh_config_hash_info", `hash="`+sum+`"`); v != 1 {
		t.Errorf("kvmesh_config_hash_info{hash=%s} = %v, want 1", sum, v)
	}
}
