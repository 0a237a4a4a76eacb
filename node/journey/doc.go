// Package journey is a request's path through a node: the request as admitted and run
// (Request), how an attempt and a dispatch ended (Outcome, Result), a decision's pass
// through the planner (Ticket), and the Executor that performs node/attempt's steps. The
// Executor takes its dependencies as a Deps struct and asks the node it runs in for the
// node's own parts of a run through Host; it never sees the node.
//
// # Contract
//
//   - A Request belongs to the one goroutine that serves it; a continuation (Origin set)
//     is a Request of its own.
//   - An Outcome counts a request once: completed, refused before the first byte, or failed
//     after it was accepted.
//   - A Ticket's View and Plan are scratch for one decision at a time.
//   - An Executor is safe for concurrent use; New does no I/O and starts no goroutine.
//   - A local run writes nothing until the engine's first token, so a failure before it is a
//     clean error, and, with Request.MoveBreak, leaves an engine's failure unwritten for the
//     caller to move the request elsewhere.
package journey
