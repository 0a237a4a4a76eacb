package node

import (
	"github.com/kvmesh/kvmesh/admit/plan"
	"github.com/kvmesh/kvmesh/node/adapters"
	"github.com/kvmesh/kvmesh/node/api"
	"github.com/kvmesh/kvmesh/node/attempt"
	"github.com/kvmesh/kvmesh/node/journey"
)

// The HTTP API's headers and codes, defined by the packages that set them (node/api,
// node/journey); docs/operating.md documents each.

// Request headers.
const (
	HeaderPriority = api.HeaderPriority
	HeaderQueueTTL = api.HeaderQueueTTL
	HeaderTTFTSLO  = api.HeaderTTFTSLO
	HeaderTPOTSLO  = api.HeaderTPOTSLO
	HeaderAgent    = api.HeaderAgent
	HeaderExplain  = journey.HeaderExplain
)

// Response headers.
const (
	HeaderNode = journey.HeaderNode
	// HeaderPrefillNode names, on a split request's response, the node that ran its prefill
	// half (HeaderNode is then the decode node; a decode_unavailable or decode_failed error
	// has it too). The ingress sets it once the prompt is handed over; a request run whole
	// never carries it.
	HeaderPrefillNode = journey.HeaderPrefillNode
	HeaderRequestID   = journey.HeaderRequestID
	HeaderReason      = journey.HeaderReason
	// HeaderNative, on a Messages request's response, says an engine that serves the
	// Messages API natively wrote the body ("messages"), passed through as it is.
	HeaderNative = journey.HeaderNative
	// HeaderPriorityGranted is the priority the request ran at when its key (or the mesh's
	// cap) allowed less than X-Kvmesh-Priority asked for.
	HeaderPriorityGranted = api.HeaderPriorityGranted
	// HeaderTTFTTarget and HeaderTPOTTarget, on an admitted request's response, are the
	// targets the mesh held it to: the client's own, or its class default with the TTFT one
	// fitted to its size.
	HeaderTTFTTarget = journey.HeaderTTFTTarget
	HeaderTPOTTarget = journey.HeaderTPOTTarget
)

// Codes of refusals and failures.
const (
	// CodeCarbonDeferred is the refusal of a sheddable request when every grid with room is
	// dirty.
	CodeCarbonDeferred = plan.CodeCarbonDeferred
	// CodeUnsupportedEndpoint (400): every node that serves the model runs the embedded
	// engine, which does not implement the endpoint (POST /v1/responses).
	CodeUnsupportedEndpoint = api.CodeUnsupportedEndpoint
	// CodePreviousResponseNotFound (404): previous_response_id names a response this mesh
	// did not produce, or one whose node has left the mesh.
	CodePreviousResponseNotFound = api.CodePreviousResponseNotFound
	// CodeNotFound (404): no such endpoint.
	CodeNotFound = api.CodeNotFound
	// CodeMethodNotAllowed (405): the endpoint exists but not for this method; Allow lists
	// the methods it takes.
	CodeMethodNotAllowed = api.CodeMethodNotAllowed
)

// Refusal and failure codes of the pair's flow (attempt's).
const (
	// CodeWrongRole is an owner's refusal (503) of a request its role does not run: a whole
	// request or a decode half on a prefill node, a prefill half on a decode node, or a whole
	// request there with its route.decode_local_prefill off, either half on a node whose
	// engine cannot split (an external engine without a role), a handover from the other
	// kind of engine.
	CodeWrongRole = attempt.CodeWrongRole
	// CodeDecodeUnavailable (503) ends a split request whose prompt was prefilled but whose
	// handover every decode node tried refused (no room).
	CodeDecodeUnavailable = attempt.CodeDecodeUnavailable
	// CodeDecodeFailed (502) ends a split request whose handover no decode node tried could
	// take: an attempt failed (unreachable, or its engine failed before the first token).
	CodeDecodeFailed = attempt.CodeDecodeFailed
)

// Codes of kvmesh engine's own endpoints.
const (
	// CodeCacheInUse (409): POST /reset_prefix_cache while requests run.
	CodeCacheInUse = api.CodeCacheInUse
	// CodeAdapterInvalid (400): a body without lora_name (or, to load, lora_path), or not
	// JSON.
	CodeAdapterInvalid = api.CodeAdapterInvalid
	// CodeAdapterExists (400): a load of an adapter already loaded, or of a base model's name.
	CodeAdapterExists = api.CodeAdapterExists
	// CodeAdapterNotFound (404): an unload of an adapter the engine does not know.
	CodeAdapterNotFound = api.CodeAdapterNotFound
)

// Codes of a LoRA adapter's load on demand, the client's answer.
const (
	// CodeAdapterLoadFailed (502): the engine refused or failed the load; the answer is final
	// (every node loads from the same source, so another would fail alike).
	CodeAdapterLoadFailed = adapters.CodeAdapterLoadFailed
	// CodeAdapterLoadTimeout (504): the load, or the wait for it, outlasted
	// adapter_load_timeout; the next candidate runs the request.
	CodeAdapterLoadTimeout = adapters.CodeAdapterLoadTimeout
	// CodeAdapterSlotsBusy (503): every adapter slot holds an adapter a request is using; the
	// next candidate runs the request.
	CodeAdapterSlotsBusy = adapters.CodeAdapterSlotsBusy
)
