package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/kvmesh/kvmesh/node/engine/sim"
	"github.com/kvmesh/kvmesh/node/openai"
)

// The embedded engine's runtime LoRA endpoints, in vLLM's shapes (vLLM serves them with
// VLLM_ALLOW_RUNTIME_LORA_UPDATING=True), so that kvmesh engine stands in for a vLLM whose
// adapters a node loads and unloads. Only kvmesh engine serves them.

// Codes of the LoRA endpoints' errors.
const (
	// CodeAdapterInvalid (400): a body without lora_name (or, to load, lora_path), or not JSON.
	CodeAdapterInvalid = "adapter_invalid"
	// CodeAdapterExists (400): a load of an adapter already loaded, or of a base model's name.
	CodeAdapterExists = "adapter_exists"
	// CodeAdapterNotFound (404): an unload of an adapter the engine does not know.
	CodeAdapterNotFound = "adapter_not_found"
)

// maxLoRABody bounds the LoRA endpoints' bodies: a name and a path.
const maxLoRABody = 64 << 10

// loraBody is the body of POST /v1/load_lora_adapter and /v1/unload_lora_adapter.
type loraBody struct {
	Name string `json:"lora_name"`
	Path string `json:"lora_path"`
}

func readLoRABody(w http.ResponseWriter, r *http.Request) (loraBody, bool) {
	var b loraBody
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxLoRABody))
	if err == nil {
		err = json.Unmarshal(data, &b)
	}
	if err != nil {
		openai.WriteError(w, openai.NewError(http.StatusBadRequest, CodeAdapterInvalid, "invalid body: "+err.Error()))
		return b, false
	}
	return b, true
}

// handleLoadLoRA is POST /v1/load_lora_adapter {lora_name, lora_path}: the engine takes its
// load time, then answers 200 with vLLM's text; 400 adapter_invalid, 400 adapter_exists, 503
// if the engine closes first.
func (n *Node) handleLoadLoRA(w http.ResponseWriter, r *http.Request) {
	b, ok := readLoRABody(w, r)
	if !ok {
		return
	}
	if err := n.sim.LoadAdapter(r.Context(), b.Name, b.Path); err != nil {
		writeLoRAError(w, err)
		return
	}
	n.log.Info("LoRA adapter loaded", "name", b.Name, "path", b.Path)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "Success: LoRA adapter '%s' added successfully.", b.Name)
}

// handleUnloadLoRA is POST /v1/unload_lora_adapter {lora_name}: 200 with vLLM's text, 400
// adapter_invalid, 404 adapter_not_found.
func (n *Node) handleUnloadLoRA(w http.ResponseWriter, r *http.Request) {
	b, ok := readLoRABody(w, r)
	if !ok {
		return
	}
	if err := n.sim.UnloadAdapter(b.Name); err != nil {
		writeLoRAError(w, err)
		return
	}
	n.log.Info("LoRA adapter unloaded", "name", b.Name)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "Success: LoRA adapter '%s' removed successfully.", b.Name)
}

func writeLoRAError(w http.ResponseWriter, err error) {
	status, code := http.StatusServiceUnavailable, openai.CodeEngineError
	switch {
	case errors.Is(err, sim.ErrAdapterArgs):
		status, code = http.StatusBadRequest, CodeAdapterInvalid
	case errors.Is(err, sim.ErrAdapterExists):
		status, code = http.StatusBadRequest, CodeAdapterExists
	case errors.Is(err, sim.ErrAdapterNotFound):
		status, code = http.StatusNotFound, CodeAdapterNotFound
	}
	openai.WriteError(w, openai.NewError(status, code, err.Error()))
}
