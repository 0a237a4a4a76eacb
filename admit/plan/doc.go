// Package plan is kvmesh's decision pipeline: for one request it asks routing where it could
// run (admit/route), applies the carbon shedding rule (carbon) and asks admission whether to
// accept, queue or refuse it (admit). The ingress runs it over its view of the mesh (Ingress,
// and Queued for a request in the waiting room); the owner a request is forwarded to runs
// Owner over its own exact state. Both predict a candidate's TTFT, TPOT and free KV with the
// same functions (route.Policy.Predict and OptionOf), so that on the same state they reach the
// same verdict.
//
// # Contract
//
//   - A request's options are its candidates in routing's order. An option's free KV is the
//     peer's total less its used blocks, less the blocks its engine's queued prefill will take
//     (QueuedBlocks: the queue is first come first served and its head waits for blocks), less
//     the blocks this node reserved on it since its last record.
//   - When routing finds hosts of the model but all of them busy, they are offered with their
//     KV as it is so that admission queues (or sheds) the request; an accept on one never runs.
//   - A sheddable request (priority < 0) runs only on a clean grid (carbon.Decide): dirty
//     candidates are dropped; none left is 429 carbon_deferred with the grid's Retry-After.
//   - Under agent admission a step of an agent runs only at its home (routing's sticky first
//     candidate) and is never refused for a predicted TTFT: it is decided again without its
//     SLO (AgentStepSLO), so it still waits for KV room there.
//   - ModeNone and ModeQueueCap send every valid request to the first candidate at once.
//   - An accept reserves the request's uncached prefill and KV blocks on the chosen candidate
//     (Reserve; Release gives them back), so the next decision sees them before gossip does.
//   - A pair's option judges the decode node's KV as forecast for when the handover arrives
//     (admit.DecodeForecast): its used blocks draining, this node's holds there and its share
//     of the prefill pool's queued work coming. Its accept holds the decode blocks until the
//     handover (Handover), when they become a reservation on the node that takes it.
//
// # Concurrency
//
// A Planner's own state is one counter, the decode blocks its split requests hold while they
// prefill; it is as safe for concurrent use as the policy and admitter it is given (both are). A Plan and a View belong to one request at a time.
// Package plan has no goroutines, no sockets, and takes time from its callers.
package plan
