// Package admit is kvmesh's admission control: the layered checks that decide, before the
// first byte of a response, whether a request is accepted now, queued in the ingress node's
// waiting room, or refused with a stable reason and a Retry-After.
//
// The layers run cheapest first, each returning a Decision that names its Layer:
//
//  1. validation (Validate): parameter bounds and a model known to the mesh;
//  2. identity (Identify): API key → tenant, a token bucket per key;
//  3. budget: prompt + max_tokens within the model context, per-tenant and per-model default
//     and maximum max_tokens, and an output-length estimate learned online (Observe);
//  4. kv: the request's predicted KV blocks against each candidate's free blocks;
//  5. queue: caps on waiting requests and waiting prefill tokens per (model, role);
//  6. priority: strict priority bands, sheddable (negative) requests shed first, eviction of a
//     lower-priority waiter by a higher-priority newcomer;
//  7. slo: predicted TTFT (the candidate's estimate plus the prefill tokens queued ahead in
//     deadline order) and TPOT against the request's SLOs; doomed requests are refused now.
//     Sheddable requests start only on spare capacity: where their predicted TTFT is within
//     half the normal class's TTFT SLO (or, for a prompt longer than that, where next to
//     nothing is queued); elsewhere they wait, so batch work cannot fill an engine and push
//     interactive traffic past its SLO.
//
// The node runs Validate and Identify before routing, then Admit with routing's candidates
// mapped to []Option; Check runs all of them. A queued request lives in the WaitingRoom as an
// Item; the node calls WaitingRoom.Next with a canRun func built on Admitter.Ready, which
// re-checks KV and SLO with fresh state each time, so a queued request is never pinned to a node.
// When a pool's head must wait for KV room, it holds its need on the candidate where it fits
// first (Admitter.ClaimFor), and up to QueueConfig.Backfill requests behind it are re-checked on
// options with that claim taken off (Claim.Take): they run beside the head without delaying it.
//
// # Hysteresis
//
// Gossiped load is late, so admission must not flap. Three things damp it. A fresh request is
// accepted while the candidate's KV use after it stays at or under KV.QueueOn (0.95); a queued
// one is dispatched only while it stays at or under KV.QueueOff (0.85), so once queueing starts
// the candidate has to drain below the lower mark before the room lets work through. Sheddable
// work stops lower still, at KV.Sheddable (0.75), so interactive bursts find room. While any
// request of equal or higher rank waits for the same (model, role), a newcomer queues behind it
// instead of overtaking it on a momentarily free slot. And Option.FreeKVBlocks is expected to
// be net of the blocks this node has reserved on the peer since its last state record (route's
// reservations), so a burst is counted before gossip reports it.
//
// # Units
//
// Load is counted in tokens and KV blocks, never request counts alone: the per-key token bucket
// charges prompt tokens + max_tokens (the request's worst-case work), the queue caps and the
// fairness between tenants count prefill (prompt) tokens.
//
// docs/design/admission.md gives the reasoning behind each layer and default; the config
// file's keys are listed in docs/operating.md.
//
// # Layout
//
// A file per layer: validate.go (1), identity.go (2, with keys.go for the key set and its
// token buckets and usage.go for a key's use across the mesh), budget.go (3, with estimate.go
// for the learned output lengths), kv.go (4, with role.go for a split request's decode room),
// queue.go (5 and 6), slo.go (7). admit.go holds the Admitter and runs the layers; layers 4 to
// 7 run as one pass over the candidates (decision.go), each layer a method that refuses, makes
// the request wait, or hands on what it found. dispatch.go holds what the waiting room's loop
// calls for a queued request (Item, Ready, ClaimFor). The waiting room: room.go (its API),
// fairqueue.go (pools, priority bands and tenants' fair queues), order.go (deadline and
// expiry order, backfill), roomcaps.go (caps, shedding and eviction) and retrymeter.go (the
// dispatch rate behind Retry-After).
//
// # Concurrency
//
// Admitter, Keys, WaitingRoom and SLOTracker are safe for concurrent use (mutexes; no
// goroutines, no I/O, time always passed in). Admitter.SetConfig and WaitingRoom.SetConfig
// change a running one's settings (a node's config reload); the waiting room, the keys'
// buckets and the learned output lengths stay. The zero values are not usable: build them with
// New, NewKeys/ParseKeys, NewWaitingRoom and NewSLOTracker.
package admit
