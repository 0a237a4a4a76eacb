// Package api is a node's HTTP API surface: the generation endpoints' ingress (decode,
// validate, identify, then the request's journey, node/journey's executor), the simple
// endpoints (embeddings, the Responses API: the least loaded node that serves the model,
// tried in turn, no waiting room), authentication by API key, and the request counters.
//
// # Contract
//
//   - Every request that reaches a handler is counted once in kvmesh_requests_received_total
//     and once in exactly one of completed, refused or failed.
//   - A request without a valid key (while keys are loaded) is refused before its body is
//     read, and costs nothing.
//   - Bad input gets a precise OpenAI error, never a panic or a silent drop.
//   - A Server is safe for concurrent use; New does no I/O and starts no goroutine. The node
//     builds it, routes to its handlers and answers for what is the node's own (Host).
package api
