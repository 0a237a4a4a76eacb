// Package journey is a request's path through a node: the request as admitted and run
// (Request), how an attempt and a dispatch ended (Outcome, Result) and a decision's pass
// through the planner (Ticket).
//
// # Contract
//
//   - A Request belongs to the one goroutine that serves it; a continuation (Origin set)
//     is a Request of its own.
//   - An Outcome counts a request once: completed, refused before the first byte, or failed
//     after it was accepted.
//   - A Ticket's View and Plan are scratch for one decision at a time.
package journey
