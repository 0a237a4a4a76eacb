package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/engine/kvevents"
	"github.com/kvmesh/kvmesh/node/engine/sim"
	"github.com/kvmesh/kvmesh/node/journey"
	"github.com/kvmesh/kvmesh/node/kvconnector"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/render"
)

// kvmesh engine's own endpoints, served by a standalone node over the embedded engine: its KV
// connector flow (a prefill's handover, its side channel and its pull, node/kvconnector's),
// POST /reset_prefix_cache, and the runtime LoRA endpoints.

// CodeCacheInUse (409): POST /reset_prefix_cache while requests run.
const CodeCacheInUse = "cache_in_use"

// HandleResetPrefixCache empties the embedded engine's prefix cache, as vLLM's POST
// /reset_prefix_cache does (in its development mode), and publishes AllBlocksCleared. Only
// kvmesh engine serves it: a standalone node has no gossip to tell.
func (sv *Server) HandleResetPrefixCache(w http.ResponseWriter, r *http.Request) {
	held, err := sv.sim.ResetPrefixCache()
	if errors.Is(err, sim.ErrCacheInUse) {
		openai.WriteError(w, openai.NewError(http.StatusConflict, CodeCacheInUse, err.Error()))
		return
	}
	if sv.kvpub != nil {
		sv.kvpub.Publish(kvevents.Event{Kind: kvevents.AllBlocksCleared})
	}
	sv.log.Info("prefix cache reset", "blocks", len(held))
	w.WriteHeader(http.StatusOK)
}

// KVPath is the path of kvmesh engine's KV side channel.
const KVPath = kvconnector.Path

// HandleKV serves kvmesh engine's KV side channel.
func (sv *Server) HandleKV(w http.ResponseWriter, r *http.Request) { sv.kv.ServeHTTP(w, r) }

// takeKVTransfer removes kv_transfer_params from p's extra fields, which the simulated engine
// would refuse, and decodes them (nil when absent, null, or asking for neither half).
func takeKVTransfer(p *journey.Request) (*openai.KVTransferParams, *openai.Error) {
	var raw []byte
	p.Req.Extra = slices.DeleteFunc(p.Req.Extra, func(f openai.Field) bool {
		if f.Name == "kv_transfer_params" {
			raw = f.Value
			return true
		}
		return false
	})
	kt, err := openai.DecodeKVTransferParams(raw)
	if err != nil {
		return nil, openai.NewError(http.StatusBadRequest, openai.CodeInvalidParameter, err.Error()).WithParam("kv_transfer_params")
	}
	if kt != nil && !kt.DoRemoteDecode && !kt.DoRemotePrefill {
		return nil, nil
	}
	return kt, nil
}

// serveEngine runs a request on kvmesh engine: whole, or the half its kv_transfer_params ask
// for. A prefill engine runs prefill halves only.
func (sv *Server) serveEngine(ctx context.Context, w http.ResponseWriter, r *http.Request, p *journey.Request, start time.Time) journey.Outcome {
	if sv.kv == nil { // not the simulated engine: its engine judges the params
		return sv.x.ServeLocal(ctx, w, p, start, "local")
	}
	refuse := func(e *openai.Error) journey.Outcome {
		journey.WriteRefusal(w, e, 0)
		return journey.Outcome{Code: e.Code, Refused: e.Status < 500}
	}
	kt, oerr := takeKVTransfer(p)
	switch {
	case oerr != nil:
		return refuse(oerr)
	case kt != nil && kt.DoRemoteDecode:
		if p.Stream {
			return refuse(openai.NewError(http.StatusBadRequest, openai.CodeInvalidParameter,
				"a prefill (kv_transfer_params.do_remote_decode) is answered whole: send it with stream false").WithParam("stream"))
		}
		return sv.answerPrefill(ctx, w, r, p)
	case kt != nil:
		h, e := sv.kv.Pull(ctx, kt, p.Req.Blocks)
		if e != nil {
			return refuse(e)
		}
		p.Req.Handover = h
	case sv.cfg.SimRole == sim.RolePrefill:
		return refuse(openai.NewError(http.StatusBadRequest, openai.CodeInvalidRequest,
			"this engine runs prefills only: send kv_transfer_params with do_remote_decode true").WithParam("kv_transfer_params"))
	}
	return sv.x.ServeLocal(ctx, w, p, start, "local")
}

// answerPrefill prefills p, keeps its handover and answers as vLLM's prefill server does: no
// text (vLLM's one token, which the proxy drops, is not drawn), finish_reason length, the
// prompt's usage and kv_transfer_params naming the handover.
func (sv *Server) answerPrefill(ctx context.Context, w http.ResponseWriter, r *http.Request, p *journey.Request) journey.Outcome {
	sv.m.Served.WithLabelValues("local").Inc()
	h, err := sv.x.Prefill(ctx, p)
	if err != nil {
		e := journey.EngineError(err)
		journey.WriteRefusal(w, e, 0)
		return journey.Outcome{Code: e.Code, Refused: e.Status < 500}
	}
	host, port, err := net.SplitHostPort(r.Host)
	if err != nil { // no port in Host: the listener's
		host = r.Host
		_, port, _ = net.SplitHostPort(sv.host.HTTPAddr())
	}
	portN, _ := strconv.Atoi(port)
	kvID := sv.kv.ID()
	kt := openai.KVTransferParams{DoRemotePrefill: true, RemoteEngineID: &kvID, RemoteHost: &host, RemotePort: &portN,
		RemoteRequestID: sv.kv.Put(h, time.Now()), RemoteBlockIDs: make([]int, len(h.Blocks))}
	for i := range kt.RemoteBlockIDs {
		kt.RemoteBlockIDs[i] = i
	}
	u := &engine.Usage{PromptTokens: h.PromptTokens, CachedTokens: h.CachedTokens}
	body, err := json.Marshal(render.New(p.Endpoint, p.Req.ID, p.Model.Name, p.IncludeUsage, time.Now()).Complete("", engine.Chunk{FinishReason: engine.FinishLength, Usage: u}, nil))
	if err == nil {
		ktb, _ := json.Marshal(kt)
		body, err = openai.SetMember(body, "kv_transfer_params", func([]byte) []byte { return ktb })
	}
	if err != nil { // unreachable: both are plain structs
		e := openai.NewError(http.StatusInternalServerError, openai.CodeEngineError, "encoding the prefill answer: "+err.Error())
		journey.WriteRefusal(w, e, 0)
		return journey.Outcome{Code: e.Code}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set(journey.HeaderNode, sv.cfg.Name)
	_, _ = w.Write(append(body, '\n'))
	return journey.Outcome{Completed: true}
}

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

// HandleLoadLoRA is POST /v1/load_lora_adapter {lora_name, lora_path}: the engine takes its
// load time, then answers 200 with vLLM's text; 400 adapter_invalid, 400 adapter_exists, 503
// if the engine closes first.
func (sv *Server) HandleLoadLoRA(w http.ResponseWriter, r *http.Request) {
	b, ok := readLoRABody(w, r)
	if !ok {
		return
	}
	if err := sv.sim.LoadAdapter(r.Context(), b.Name, b.Path); err != nil {
		writeLoRAError(w, err)
		return
	}
	sv.log.Info("LoRA adapter loaded", "name", b.Name, "path", b.Path)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "Success: LoRA adapter '%s' added successfully.", b.Name)
}

// HandleUnloadLoRA is POST /v1/unload_lora_adapter {lora_name}: 200 with vLLM's text, 400
// adapter_invalid, 404 adapter_not_found.
func (sv *Server) HandleUnloadLoRA(w http.ResponseWriter, r *http.Request) {
	b, ok := readLoRABody(w, r)
	if !ok {
		return
	}
	if err := sv.sim.UnloadAdapter(b.Name); err != nil {
		writeLoRAError(w, err)
		return
	}
	sv.log.Info("LoRA adapter unloaded", "name", b.Name)
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
