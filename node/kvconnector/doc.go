// Package kvconnector is kvmesh engine's side of vLLM's KV connector flow
// (docs/design/disaggregation.md#external-engines), so that a node in front of it in a prefill
// or decode role runs as in front of vLLM: the handovers a prefill engine holds (Store), the
// side channel that serves them (Store.ServeHTTP) and a decode engine's pull (Store.Pull). A
// request whose kv_transfer_params ask for a remote decode is prefilled alone: the engine keeps the
// handover under a new id for HeldTTL and answers, as vLLM's prefill server does, with
// kv_transfer_params naming it (remote_engine_id this engine, remote_request_id the handover,
// remote_block_ids its blocks, remote_host and remote_port this engine's API). A request whose
// kv_transfer_params carry those is decoded from the handover, which the decode engine pulls
// from the prefill engine's GET /kvmesh/kv/{id} (Path) (vLLM's NIXL side channel, in kvmesh's form): it
// then charges the transfer, KV bytes over its link, as the embedded decode role does. A
// handover may be pulled more than once (a retried decode), until it expires.
//
// # Concurrency
//
// A Store is safe for concurrent use.
package kvconnector
