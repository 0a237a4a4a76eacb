// Package attempt plans a request's journey through the mesh, one attempt at a time: given the
// candidates a decision chose and the result of the last attempt, it returns the next step
// (run on this node, forward to a peer, prefill on one node then decode on another, wait for
// decode room, go back to the waiting room, move a broken stream, end with a code). The node's
// executor performs each step and reports its result; the planner never performs one.
//
// It is pure, in the manner of a consensus library's Ready: no sockets, no goroutines, no
// clock (time is passed in), so that the failover rules are tested by tables, without a mesh.
//
// # Contract
//
//   - Whole plans one dispatch of a decision: its candidates from the chosen one on, at most
//     Attempts of them. An owner's refusal moves on to the next candidate, and when all refused
//     the request goes back to the waiting room (Requeue). A failure (the owner unreachable,
//     its engine failing before the first token) moves on too, but is counted across the
//     request's dispatches (Failures): the request ends (Fail, with the last failure's code)
//     after Attempts failures in all, when every attempt of a dispatch failed, or when the
//     retry budget allows no retry. An attempt after a failure is a rerun: its first-token
//     deadline may be renewed, and a forward to a peer needs the retry budget.
//   - Prefill plans the prefill half of a split request: the pair's prefill node, then the
//     search's other prefill candidates until one hands the prompt's KV over, at most Attempts
//     tries. After a failure, a peer is tried only if the retry budget allows it (else it is
//     skipped). No handover ends the pair as a refusal (Requeue) or, if an attempt failed, as
//     that failure (Fail).
//   - Decode plans the decode half: the pair's decode node, then the search's, at most Attempts
//     at first. When every one refused, the handover waits for decode room (WaitDecodeRoom),
//     offered to every decode node (Widen) again each Retry until the request's deadline; a
//     failure stops the waiting. It ends with CodeDecodeUnavailable (all refused) or
//     CodeDecodeFailed (an attempt failed), or CodeWrongRole when no node left can take it.
//   - Whole ends a dispatch with Migrate when this node's engine failed after the client's
//     response began (Broke): the request moves on as a continuation, and the node is no
//     home for its agent. A peer that fails mid-response is moved by the relay of its answer.
//   - Move decides what becomes of a request whose owner, or its engine, failed mid-response.
//
// # Concurrency
//
// A planner belongs to one request and is used by one goroutine at a time.
package attempt
