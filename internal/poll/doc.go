// Package poll waits in tests for a condition that something running concurrently (a node,
// a gossip cluster, an engine's step loop) will make true: it checks the condition again and
// again, with a short backoff, until it holds or a deadline passes. kvmesh's tests wait this
// way instead of sleeping for a guessed duration, so a slow machine makes them slower, not
// flaky.
//
// It imports only the standard library's testing and time. Pure packages may use it in their
// tests only: it is not part of any library's dependency graph.
//
// # Concurrency
//
// Until and Within run the condition on the calling goroutine, so a condition may call the
// test's t (Until must be called from the goroutine running the test, as t.Fatalf requires).
// Separate calls may run concurrently.
package poll
