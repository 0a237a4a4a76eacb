package journey

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/firsttoken"
	"github.com/kvmesh/kvmesh/node/openai"
)

// Headers a request's journey reads and sets (node documents them with its API).
const (
	HeaderNode        = "X-Kvmesh-Node"
	HeaderReason      = "X-Kvmesh-Reason"
	HeaderPrefillNode = "X-Kvmesh-Prefill-Node"
	HeaderRequestID   = "X-Kvmesh-Request-Id"
	HeaderExplain     = "X-Kvmesh-Explain"
	// HeaderTTFTTarget and HeaderTPOTTarget, on an admitted request's response, are the
	// targets the mesh held it to: the client's own, or its class default with the TTFT one
	// fitted to its size.
	HeaderTTFTTarget = "X-Kvmesh-TTFT-Target"
	HeaderTPOTTarget = "X-Kvmesh-TPOT-Target"
)

// Codes a request's journey ends with.
const (
	// CodeAgentPaused is an owner's refusal of an agent step whose agent is outside its
	// window (paused, or new and waiting for a slot). The ingress holds the step and retries
	// it at the same owner; the client never sees this code unless the step's queue TTL runs
	// out.
	CodeAgentPaused = "agent_paused"
	// CodeIngressMismatch is an owner's refusal (403) of a forward whose header names an
	// ingress other than the node the sender's certificate was issued for.
	CodeIngressMismatch = "ingress_mismatch"
	// CodeHopLimit is the refusal of a request forwarded more often than a forward's hop
	// limit.
	CodeHopLimit = "hop_limit"
	// CodeDraining is the refusal (503) of a node that is shutting down.
	CodeDraining = "draining"
	// CodeOwnerUnreachable is the failure (502) of a request whose last attempt could not
	// reach its owner: the QUIC handshake or the stream failed before any answer.
	CodeOwnerUnreachable = "owner_unreachable"
	// CodeAdapterLoadFailed (502): the engine refused or failed the load of a request's LoRA
	// adapter; the answer is final (every node loads from the same source, so another would
	// fail alike).
	CodeAdapterLoadFailed = "adapter_load_failed"
)

// ErrDrainTimeout is the cause with which the drain timeout ends the requests still running.
var ErrDrainTimeout = errors.New("the node's drain timeout passed")

// DrainCut is the error of a request the drain timeout (timeout, of the node named name)
// ended, when ctx (its context) says it did; nil otherwise.
func DrainCut(ctx context.Context, name string, timeout time.Duration) *openai.Error {
	if !errors.Is(context.Cause(ctx), ErrDrainTimeout) {
		return nil
	}
	return openai.NewError(http.StatusServiceUnavailable, CodeDraining,
		fmt.Sprintf("node %s shut down: its drain timeout (%v) ended the request before it completed", name, timeout))
}

// WriteRefusal answers with an OpenAI error body, X-Kvmesh-Reason and, for 429 and 503,
// Retry-After in whole seconds (at least 1).
func WriteRefusal(w http.ResponseWriter, e *openai.Error, retryAfter time.Duration) {
	h := w.Header()
	h.Set(HeaderReason, e.Code)
	if e.Status == http.StatusTooManyRequests || e.Status == http.StatusServiceUnavailable {
		secs := int((retryAfter + time.Second - 1) / time.Second)
		h.Set("Retry-After", fmt.Sprint(max(secs, 1)))
	}
	openai.WriteError(w, e)
}

// EngineError maps an error from Engine.Generate (before any output) to the client's answer.
// A field the engine refused is a 400 naming it. An external engine's HTTP error says itself
// what the client gets (external.StatusError's APIError): a 4xx keeps its status, message,
// param and code; a 5xx is a 502 engine_error.
func EngineError(err error) *openai.Error {
	var pe *engine.ParamError
	var ae interface{ APIError() *openai.Error }
	switch {
	case errors.As(err, &pe) && pe.Unsupported:
		return openai.NewError(http.StatusBadRequest, openai.CodeUnsupportedParameter,
			fmt.Sprintf("unsupported parameter %q: %s", pe.Param, pe.Reason)).WithParam(pe.Param)
	case errors.As(err, &pe):
		return openai.NewError(http.StatusBadRequest, openai.CodeInvalidParameter,
			fmt.Sprintf("invalid parameter %q: %s", pe.Param, pe.Reason)).WithParam(pe.Param)
	case errors.As(err, &ae):
		return ae.APIError()
	case errors.As(err, new(*firsttoken.Late)):
		return openai.ErrEngineTimeout(err.Error())
	case errors.Is(err, engine.ErrRejected):
		return openai.NewError(http.StatusBadRequest, openai.CodeInvalidRequest, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return openai.NewError(http.StatusGatewayTimeout, openai.CodeEngineTimeout, "engine did not answer in time")
	default:
		return openai.NewError(http.StatusBadGateway, openai.CodeEngineError, "engine failed before the first token: "+err.Error())
	}
}
