// Package responseid holds the ids of Responses API responses across the mesh: the engine that
// ran a response keeps its state, so its id names the node that ran it (Tag, ID, Parse), and
// Rewrite tags the engine's own id in its answer, a JSON object or an event stream, on the way
// back to the client.
//
// # Concurrency
//
// Its functions are safe for concurrent use; a reader Rewrite returns is read by one goroutine
// at a time.
package responseid
