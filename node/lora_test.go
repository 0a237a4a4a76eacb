package node_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/openai"
)

// kvmesh engine lists its adapters as vLLM does, runs a request for one, loads and unloads
// them through vLLM's runtime endpoints with vLLM's answers, and reports vllm:lora_requests_info.
func TestEngineServesLoRAAdaptersAsVLLM(t *testing.T) {
	const base = "base-model"
	eng := startEngineNode(t, base, 256, func(c *node.Config) {
		c.Sim.LoRAModules = map[string]string{"a": "/lora/a"}
		c.Sim.MaxLoRAs = 1
	})
	url := "http://" + eng.HTTPAddr()
	adapters := func() map[string]openai.Model {
		t.Helper()
		_, body := get(t, url+"/v1/models")
		var list openai.ModelList
		if err := json.Unmarshal(body, &list); err != nil {
			t.Fatalf("models %s: %v", body, err)
		}
		out := map[string]openai.Model{}
		for _, m := range list.Data {
			if m.Parent != "" {
				out[m.ID] = m
			}
		}
		return out
	}
	if a := adapters(); len(a) != 1 || a["a"].Parent != base || a["a"].Root != "/lora/a" {
		t.Fatalf("adapters listed %+v, want a of %s at /lora/a", a, base)
	}
	if resp := post(t, url, "/v1/chat/completions", chatFor("a", "hello"), nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("request for adapter a: status %d: %s", resp.StatusCode, readAll(t, resp))
	} else {
		readAll(t, resp)
	}

	steps := []struct {
		path, body string
		status     int
		want       string // the text of a 200, the error code otherwise
	}{
		{"/v1/load_lora_adapter", `{"lora_name":"b","lora_path":"/lora/b"}`, 200, "Success: LoRA adapter 'b' added successfully."},
		{"/v1/load_lora_adapter", `{"lora_name":"b","lora_path":"/lora/b"}`, 400, node.CodeAdapterExists},
		{"/v1/load_lora_adapter", `{"lora_name":"c"}`, 400, node.CodeAdapterInvalid},
		{"/v1/load_lora_adapter", `{"lora_name":`, 400, node.CodeAdapterInvalid},
		{"/v1/unload_lora_adapter", `{"lora_name":"z"}`, 404, node.CodeAdapterNotFound},
		{"/v1/unload_lora_adapter", `{"lora_name":"a"}`, 200, "Success: LoRA adapter 'a' removed successfully."},
	}
	for _, s := range steps {
		resp := post(t, url, s.path, s.body, nil)
		body := string(readAll(t, resp))
		if resp.StatusCode != s.status {
			t.Fatalf("%s %s: status %d (%s), want %d", s.path, s.body, resp.StatusCode, body, s.status)
		}
		if s.status == 200 && body != s.want || s.status != 200 && !strings.Contains(body, `"code":"`+s.want+`"`) {
			t.Fatalf("%s %s: body %s, want %s", s.path, s.body, body, s.want)
		}
	}
	if a := adapters(); len(a) != 1 || a["b"].Root != "/lora/b" {
		t.Fatalf("adapters listed %+v, want b alone", a)
	}
	if v := metric(t, url, "vllm:lora_requests_info", `max_lora="1"`); v <= 0 {
		t.Errorf("vllm:lora_requests_info = %v, want the time of the reading", v)
	}
}

// A node in front of kvmesh engine learns its adapters from the model list, lists them with
// their parent, and runs a request for one on the engine.
func TestNodeDiscoversAnExternalEnginesAdapters(t *testing.T) {
	const base = "base-model"
	eng := startEngineNode(t, base, 256, func(c *node.Config) {
		c.Sim.LoRAModules = map[string]string{"a": "/lora/a"}
	})
	tn := startNet(t, 1, func(i int, cfg *node.Config) {
		cfg.Engine, cfg.Models = "http://"+eng.HTTPAddr(), nil
	})
	url := tn.URLs()[0]
	_, body := get(t, url+"/v1/models")
	var list openai.ModelList
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatalf("models %s: %v", body, err)
	}
	found := false
	for _, m := range list.Data {
		found = found || m.ID == "a" && m.Parent == base && m.Root == "/lora/a"
	}
	if !found {
		t.Fatalf("the node's /v1/models %s lists no adapter a of %s", body, base)
	}
	resp := post(t, url, "/v1/chat/completions", chatFor("a", "hello"), nil)
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("request for adapter a through the node: status %d: %s", resp.StatusCode, b)
	}
}

// A request for an adapter that one node's engine serves is valid at every ingress of the
// mesh, runs on that node, and every node's /v1/models lists the adapter with its parent.
func TestAdapterIsServedMeshWide(t *testing.T) {
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		if i == 0 {
			cfg.Sim.LoRAModules = map[string]string{"tenant-sql": "/lora/sql"}
		}
	})
	ingress := tn.URLs()[1]
	poll.Until(t, 10*time.Second, "node 1 to list node 0's adapter", func() bool {
		_, body := get(t, ingress+"/v1/models")
		var list openai.ModelList
		_ = json.Unmarshal(body, &list)
		for _, m := range list.Data {
			if m.ID == "tenant-sql" && m.Parent == node.DefaultModel {
				return true
			}
		}
		return false
	})
	for range 3 {
		resp := post(t, ingress, "/v1/chat/completions", chatFor("tenant-sql", "hello"), nil)
		body := readAll(t, resp)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("adapter request at node 1: status %d: %s", resp.StatusCode, body)
		}
		if got := resp.Header.Get(node.HeaderNode); got != tn.Nodes[0].Name() {
			t.Fatalf("adapter request ran on %q, want %q, the node serving it", got, tn.Nodes[0].Name())
		}
	}
}
