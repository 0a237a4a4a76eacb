// Package render turns an engine's output into the OpenAI wire format of one request's
// endpoint: the streamed chunks (the opening role chunk, text and finishing chunks, the usage
// chunk), the whole non-streaming response, the model object, and the token logprobs in the
// chat or completions API's shape.
//
// It builds values only: writing them (JSON, server-sent events) is the caller's.
//
// # Concurrency
//
// An Encoder is immutable once built and safe for concurrent use; a Logprobs counts text
// offsets across a stream's chunks and is used by one goroutine at a time.
package render
