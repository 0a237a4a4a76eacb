// Package relay holds the client's side of a stream an owner node answers: Stream passes the
// owner's server-sent events on whole, as each completes, keeps what the client was sent (the
// text and the chunks that carried it) and whether the stream ended, and, when the owner fails
// mid-response, lets a continuation on another node write on into the same response, so the
// client reads one stream.
//
// It speaks the OpenAI event stream only; it sends nothing over the mesh and imports no
// transport.
//
// # Concurrency
//
// A Stream is used by one goroutine at a time.
package relay
