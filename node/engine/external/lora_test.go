package external

import (
	"reflect"
	"testing"

	"github.com/kvmesh/kvmesh/node/engine"
)

// modelsLoRA is vLLM's /v1/models with LoRA adapters: each lists its parent and root, and no
// max_model_len; x is an adapter of a model the engine does not serve here.
const modelsLoRA = `{"object":"list","data":[
{"id":"base","object":"model","root":"/models/base","parent":null,"max_model_len":8192},
{"id":"other","object":"model","max_model_len":4096},
{"id":"sql","object":"model","root":"/lora/sql","parent":"base"},
{"id":"chat","object":"model","root":"/lora/chat","parent":"base"},
{"id":"x","object":"model","root":"/lora/x","parent":"other"}]}`

// vLLM keeps a lora_requests_info series for every label set it had; the latest is the one
// with the largest value (the time it was set).
const metricsLoRA = `vllm:num_requests_running 2
vllm:num_requests_waiting 1
vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.7000000e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql,chat",waiting_lora_adapters="x"} 1.7000005e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql",waiting_lora_adapters=""} 1.7000003e+09
`

func TestAdaptersDiscoveredFromVLLM(t *testing.T) {
	tests := []struct {
		name       string
		configured []engine.Model
		want       []engine.Model
	}{
		{"every model", nil, []engine.Model{
			{Name: "base", ContextTokens: 8192, Root: "/models/base"},
			{Name: "other", ContextTokens: 4096},
			{Name: "sql", ContextTokens: 8192, Parent: "base", Root: "/lora/sql"},
			{Name: "chat", ContextTokens: 8192, Parent: "base", Root: "/lora/chat"},
			{Name: "x", ContextTokens: 4096, Parent: "other", Root: "/lora/x"},
		}},
		{"configured base: its adapters too", []engine.Model{{Name: "base"}}, []engine.Model{
			{Name: "base", ContextTokens: 8192, Root: "/models/base"},
			{Name: "sql", ContextTokens: 8192, Parent: "base", Root: "/lora/sql"},
			{Name: "chat", ContextTokens: 8192, Parent: "base", Root: "/lora/chat"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			f.mu.Lock()
			f.models = modelsLoRA
			f.mu.Unlock()
			f.set(metricsLoRA)
			e := newEngine(t, f, KindVLLM, func(c *Config) { c.Models = tt.configured })
			if got := e.Models(); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("models\n got %+v\nwant %+v", got, tt.want)
			}
			want := engine.LoRAState{MaxLoRAs: 4, Resident: []string{"chat", "sql"}, Running: []string{"chat", "sql"}, Waiting: []string{"x"}}
			if got := e.State().LoRA; !reflect.DeepEqual(got, want) {
				t.Errorf("LoRA state %+v, want %+v", got, want)
			}
		})
	}
}

func TestNoLoRAInfoIsNoAdapterState(t *testing.T) {
	f := newFake(t)
	f.set("vllm:num_requests_running 2\nvllm:num_requests_waiting 1\n")
	e := newEngine(t, f, KindVLLM, nil)
	if got := e.State().LoRA; !reflect.DeepEqual(got, engine.LoRAState{}) {
		t.Errorf("LoRA state %+v, want none", got)
	}
}
