package api

// Request headers.
const (
	HeaderPriority = "X-Kvmesh-Priority"
	HeaderQueueTTL = "X-Kvmesh-Queue-TTL"
	HeaderTTFTSLO  = "X-Kvmesh-TTFT-SLO"
	HeaderTPOTSLO  = "X-Kvmesh-TPOT-SLO"
	HeaderAgent    = "X-Kvmesh-Agent"
)

// HeaderPriorityGranted, on a response, is the priority the request ran at when its key (or
// the mesh's cap) allowed less than X-Kvmesh-Priority asked for.
const HeaderPriorityGranted = "X-Kvmesh-Priority-Granted"

// Codes of the simple endpoints' refusals.
const (
	// CodeUnsupportedEndpoint (400): every node that serves the model runs the embedded
	// engine, which does not implement the endpoint (POST /v1/responses).
	CodeUnsupportedEndpoint = "unsupported_endpoint"
	// CodePreviousResponseNotFound (404): previous_response_id names a response this mesh did
	// not produce, or one whose node has left the mesh.
	CodePreviousResponseNotFound = "previous_response_not_found"
)

// Codes of the HTTP API's own errors, beside the request path's (openai.Code*).
const (
	// CodeNotFound (404): no such endpoint.
	CodeNotFound = "not_found"
	// CodeMethodNotAllowed (405): the endpoint exists but not for this method; Allow lists the
	// methods it takes.
	CodeMethodNotAllowed = "method_not_allowed"
)

// HeaderAPIKey is the Messages API's key header, taken where Authorization is absent
// (Bearer).
const HeaderAPIKey = "X-Api-Key"

// HeaderAgentFinal, set to 1 on an agent's last step, ends the agent at its home once that
// step is done, so its window slot goes to the next agent at once instead of after the idle
// timeout.
const HeaderAgentFinal = "X-Kvmesh-Agent-Final"

// inputCounter is a writer that learns the prompt tokens the ingress counted for its request
// (anthropic.ResponseWriter, for message_start).
type inputCounter interface{ SetInputTokens(n int) }
