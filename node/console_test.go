package node_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/console"
)

var consolePaths = []string{console.Page, console.PathScript, console.PathStyle, console.PathState, console.PathExplain}

// TestConsoleAsksAKeyWhileKeysAreOn pins the console on the API listener with a key file: 401
// and a Basic challenge without a key, served with one as a bearer token or as the password of
// Basic authentication (the way a browser sends it).
func TestConsoleAsksAKeyWhileKeysAreOn(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte(scrapeKeyLine+admit.HashKey("sk-user")+" user\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tn := startNet(t, 1, func(i int, cfg *node.Config) { cfg.APIKeysFile = keys })
	url := tn.URLs()[0]
	for _, path := range consolePaths {
		req, _ := http.NewRequest(http.MethodGet, url+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body := readAll(t, resp)
		if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic ") {
			t.Errorf("%s without a key: %d %q %s, want 401 with a Basic challenge", path, resp.StatusCode, resp.Header.Get("WWW-Authenticate"), body)
		}
		if status, body := getWithKey(t, url+path, "sk-user"); status != http.StatusOK {
			t.Errorf("%s with a bearer key: %d %s", path, status, body)
		}
		req, _ = http.NewRequest(http.MethodGet, url+path, nil)
		req.SetBasicAuth("", "sk-user")
		if resp, err = http.DefaultClient.Do(req); err != nil {
			t.Fatal(err)
		}
		if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Errorf("%s with the key as Basic password: %d %s", path, resp.StatusCode, body)
		}
		req.SetBasicAuth("", "sk-wrong")
		if resp, err = http.DefaultClient.Do(req); err != nil {
			t.Fatal(err)
		}
		if body := readAll(t, resp); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s with a wrong Basic password: %d %s, want 401", path, resp.StatusCode, body)
		}
	}
}

// TestConsoleOnTheAdminListener pins --admin-addr: the console is served there without a key,
// and not on the API listener; NoConsole serves it nowhere.
func TestConsoleOnTheAdminListener(t *testing.T) {
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		cfg.AdminAddr = "127.0.0.1:0"
		cfg.NoConsole = i == 1
	})
	for i, want := range []int{http.StatusOK, http.StatusNotFound} {
		admin := "http://" + tn.Nodes[i].AdminAddr()
		for _, path := range consolePaths {
			if status, body := getWithKey(t, admin+path, ""); status != want {
				t.Errorf("node %d admin %s: %d %s, want %d", i, path, status, body, want)
			}
			if status, body := getWithKey(t, tn.URLs()[i]+path, ""); status != http.StatusNotFound {
				t.Errorf("node %d API listener %s with --admin-addr: %d %s, want 404", i, path, status, body)
			}
		}
	}
	status, body := getWithKey(t, "http://"+tn.Nodes[0].AdminAddr()+console.Page, "")
	if status != http.StatusOK || !strings.Contains(string(body), "/console/console.js") {
		t.Fatalf("page: %d %.200s", status, body)
	}
}

// TestConsoleStateAndExplanation pins the data the page reads: the mesh, the metric families,
// the forward counts by peer and the explanation of a request by its id.
func TestConsoleStateAndExplanation(t *testing.T) {
	tn := startNet(t, 2, nil)
	url := tn.URLs()[0]
	var id string
	for range 6 {
		resp := post(t, url, "/v1/chat/completions", chatBody("explain me", 4, false), nil)
		readAll(t, resp)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("chat: %d", resp.StatusCode)
		}
		id = resp.Header.Get(node.HeaderRequestID)
	}
	var st struct {
		Node string `json:"node"`
		Mesh struct {
			Peers []node.PeerInfo `json:"peers"`
		} `json:"mesh"`
		Metrics map[string][]console.Sample `json:"metrics"`
		Recent  []console.Explanation       `json:"recent"`
	}
	if err := json.Unmarshal(adminGet(t, url+console.PathState), &st); err != nil {
		t.Fatal(err)
	}
	if st.Node != tn.Nodes[0].Name() || len(st.Mesh.Peers) != 2 {
		t.Fatalf("state of %q with %d peers, want %q with 2", st.Node, len(st.Mesh.Peers), tn.Nodes[0].Name())
	}
	for _, f := range []string{"kvmesh_admission_decisions_total", "kvmesh_admission_class_decisions_total", "kvmesh_slo_met_total", "kvmesh_forward_attempts_total"} {
		if len(st.Metrics[f]) == 0 {
			t.Errorf("state lacks %s", f)
		}
	}
	if len(st.Recent) == 0 || st.Recent[0].ID != id {
		t.Fatalf("recent %+v, want %s first", st.Recent, id)
	}
	var e console.Explanation
	if err := json.Unmarshal(adminGet(t, url+console.PathExplain+"?id="+id), &e); err != nil {
		t.Fatal(err)
	}
	if e.ID != id || e.Action != "accept" || e.Chosen == "" || len(e.Candidates) == 0 || e.Candidates[0].Name == "" {
		t.Fatalf("explanation %+v", e)
	}
	if status, body := getWithKey(t, url+console.PathExplain+"?id=nope", ""); status != http.StatusNotFound {
		t.Fatalf("unknown id: %d %s, want 404", status, body)
	}
}
