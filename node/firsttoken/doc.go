// Package firsttoken bounds an engine's wait for a request's first token. A request has its
// first token (a prefill half: its handover) within its queue TTL of its arrival at the
// ingress, whether it waited in the waiting room, in an engine's own queue, or both; the node
// that runs it on its engine holds the generation to that deadline with Bound: past it, the
// engine's request is cancelled and the generation ends with a *Late, which the node answers
// 504 engine_timeout. After the first token nothing bounds the rest.
//
// # Concurrency
//
// A bounded stream belongs to one goroutine, as an engine's does; its deadline fires on a
// timer of its own, and its Close may be called from any.
package firsttoken
