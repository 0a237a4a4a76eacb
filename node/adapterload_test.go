package node_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/openai"
)

// adapterSource writes a JSON adapter source of names, each an adapter of base, and returns
// its path.
func adapterSource(t *testing.T, base string, names ...string) string {
	t.Helper()
	src := map[string]map[string]string{}
	for _, n := range names {
		src[n] = map[string]string{"path": "/lora/" + n, "base": base}
	}
	data, _ := json.Marshal(src)
	f := filepath.Join(t.TempDir(), "adapters.json")
	if err := os.WriteFile(f, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// loadMesh starts two nodes with the same adapter source: node 0 serves the default model on
// the embedded engine (slots adapter slots), node 1 another model only, so that node 1 is an
// ingress whose requests for the source's adapters run on node 0, over QUIC.
func loadMesh(t *testing.T, slots int, loadTime time.Duration, names ...string) (ingress, owner string, n0 *node.Node) {
	t.Helper()
	src := adapterSource(t, model, names...)
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		cfg.AdapterSource = src
		if i == 0 {
			cfg.Sim.MaxLoRAs, cfg.Sim.LoRALoadTime = slots, loadTime
		} else {
			cfg.Models = []string{"other-model"}
		}
	})
	return tn.URLs()[1], tn.URLs()[0], tn.Nodes[0]
}

func runAdapter(t *testing.T, url, adapter string) *http.Response {
	t.Helper()
	resp := post(t, url, "/v1/chat/completions", chatFor(adapter, "hello "+adapter), nil)
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("request for adapter %s: status %d: %s", adapter, resp.StatusCode, body)
	}
	return resp
}

func engineAdapters(t *testing.T, url string) []string {
	t.Helper()
	_, body := get(t, url+"/v1/models")
	var list openai.ModelList
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatalf("models %s: %v", body, err)
	}
	var out []string
	for _, m := range list.Data {
		if m.Parent != "" {
			out = append(out, m.ID)
		}
	}
	slices.Sort(out)
	return out
}

// An adapter of the source that no engine holds is valid at an ingress that does not serve its
// base; it runs on the node serving the base, whose engine loads it first, and the next
// record of that node shows it resident.
func TestAdapterLoadedOnDemandThenServed(t *testing.T) {
	ingress, owner, n0 := loadMesh(t, 4, 0, "tenant-a")
	resp := runAdapter(t, ingress, "tenant-a")
	if got := resp.Header.Get(node.HeaderNode); got != n0.Name() {
		t.Fatalf("ran on %q, want %q", got, n0.Name())
	}
	if v := metric(t, owner, "kvmesh_adapter_loads_total", `outcome="loaded"`); v != 1 {
		t.Errorf("loads on the owner = %v, want 1", v)
	}
	runAdapter(t, ingress, "tenant-a") // held now: no second load
	if v := metric(t, owner, "kvmesh_adapter_loads_total", `outcome="loaded"`); v != 1 {
		t.Errorf("loads after a second request = %v, want 1", v)
	}
	if v := metric(t, owner, "kvmesh_adapter_load_seconds_count", ""); v != 1 {
		t.Errorf("load latency observations = %v, want 1", v)
	}
	poll.Until(t, 10*time.Second, "the ingress to see tenant-a resident on node 0", func() bool {
		for _, p := range peers(t, ingress).Peers {
			if p.Name == n0.Name() && slices.ContainsFunc(p.Adapters, func(a gossip.Adapter) bool {
				return a.Name == "tenant-a" && a.Resident && a.Parent == model
			}) {
				return p.LoRASlots == 4
			}
		}
		return false
	})
}

// With every slot held, a load unloads the least recently used idle adapter first.
func TestAdapterLoadUnloadsTheLeastRecentlyUsed(t *testing.T) {
	ingress, owner, _ := loadMesh(t, 2, 0, "a", "b", "c")
	for _, a := range []string{"a", "b", "a", "c"} {
		runAdapter(t, ingress, a)
	}
	if v := metric(t, owner, "kvmesh_adapter_evictions_total", ""); v != 1 {
		t.Errorf("evictions = %v, want 1", v)
	}
	holds := func(want ...string) {
		t.Helper()
		// The node's /v1/models is the mesh's: its own last record too, until the next.
		poll.Until(t, 10*time.Second, fmt.Sprintf("node 0 to hold adapters %v", want), func() bool {
			return slices.Equal(engineAdapters(t, owner), want)
		})
	}
	holds("a", "c")             // b, the least recently used, unloaded
	runAdapter(t, ingress, "b") // b loads again, in a's place
	holds("b", "c")
}

// Two concurrent first requests for an adapter cause one load; both are served.
func TestConcurrentFirstRequestsCauseOneLoad(t *testing.T) {
	// 20s of simulated time at the tests' 20× is a second's load: the requests overlap it.
	ingress, owner, _ := loadMesh(t, 4, 20*time.Second, "tenant-a")
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			resp := post(t, ingress, "/v1/chat/completions", chatFor("tenant-a", "hello"), nil)
			if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
				t.Errorf("status %d: %s", resp.StatusCode, body)
			}
		})
	}
	wg.Wait()
	if v := metric(t, owner, "kvmesh_adapter_loads_total", `outcome="loaded"`); v != 1 {
		t.Errorf("loads = %v, want 1", v)
	}
}

// A load the engine refuses answers 502 adapter_load_failed naming the adapter, from the node
// that tried it, through the ingress; a good adapter of the same source loads through the
// external engine's runtime API (vLLM's POST /v1/load_lora_adapter).
func TestFailedAdapterLoadAnswersAClearError(t *testing.T) {
	const base = "base-model"
	vllm, eng := failingVLLM(t, base)
	src := adapterSource(t, base, "broken", "good")
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		cfg.AdapterSource = src
		if i == 0 {
			cfg.Engine, cfg.Models = vllm, nil
		} else {
			cfg.Models = []string{"other-model"}
		}
	})
	ingress, owner := tn.URLs()[1], tn.URLs()[0]
	resp := post(t, ingress, "/v1/chat/completions", chatFor("broken", "hello"), nil)
	body := readAll(t, resp)
	e := decodeError(t, body)
	if resp.StatusCode != http.StatusBadGateway || e.Error.Code != node.CodeAdapterLoadFailed ||
		!strings.Contains(e.Error.Message, `"broken"`) || !strings.Contains(e.Error.Message, "No adapter found") {
		t.Fatalf("status %d %s, want 502 %s naming the adapter and the engine's reason", resp.StatusCode, body, node.CodeAdapterLoadFailed)
	}
	if v := metric(t, owner, "kvmesh_adapter_loads_total", `outcome="failed"`); v != 1 {
		t.Errorf("failed loads = %v, want 1", v)
	}
	runAdapter(t, ingress, "good")
	if got := engineAdapters(t, "http://"+eng.HTTPAddr()); !slices.Equal(got, []string{"good"}) {
		t.Errorf("the engine holds %v, want good", got)
	}
}

// failingVLLM serves an embedded engine of base behind vLLM's runtime adapter API, whose load
// of the adapter "broken" fails as vLLM's does when no adapter is at the path. It returns the
// server's URL and the engine's node.
func failingVLLM(t *testing.T, base string) (string, *node.Node) {
	t.Helper()
	eng := startEngineNode(t, base, 256, func(c *node.Config) { c.Sim.MaxLoRAs = 2 })
	target, _ := url.Parse("http://" + eng.HTTPAddr())
	proxy := httputil.NewSingleHostReverseProxy(target)
	vllm := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/load_lora_adapter" {
			var b struct {
				Name string `json:"lora_name"`
			}
			data, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(data))
			_ = json.Unmarshal(data, &b)
			if b.Name == "broken" {
				w.WriteHeader(http.StatusBadRequest)
				fmt.Fprint(w, `{"error":{"message":"Loading lora broken failed: No adapter found for /lora/broken","type":"BadRequestError","code":400}}`)
				return
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(vllm.Close)
	return vllm.URL, eng
}

// A reload reads the adapter source again: an adapter it adds is valid at once and loads at
// its first request.
func TestReloadReadsTheAdapterSourceAgain(t *testing.T) {
	src := adapterSource(t, model, "tenant-a")
	tn := startNet(t, 1, func(_ int, cfg *node.Config) {
		cfg.AdapterSource = src
		cfg.Sim.MaxLoRAs = 4
	})
	url, n0 := tn.URLs()[0], tn.Nodes[0]
	resp := post(t, url, "/v1/chat/completions", chatFor("tenant-b", "hello"), nil)
	if body := readAll(t, resp); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("tenant-b before the reload: status %d: %s", resp.StatusCode, body)
	}
	data, _ := json.Marshal(map[string]string{"tenant-a": "/lora/tenant-a", "tenant-b": "/lora/tenant-b"})
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := n0.Reload(); err != nil {
		t.Fatal(err)
	}
	runAdapter(t, url, "tenant-b")
	if v := metric(t, url, "kvmesh_adapter_loads_total", `outcome="loaded"`); v != 1 {
		t.Errorf("loads = %v, want tenant-b's", v)
	}
}
