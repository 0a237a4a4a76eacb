// Package openai holds kvmesh's OpenAI wire format: the request types of
// POST /v1/chat/completions and POST /v1/completions with strict decoding, the response and
// streaming-chunk types, OpenAI-shaped error bodies, and server-sent events in both directions.
//
// # Decoding
//
// DecodeChat and DecodeCompletion read a whole body under a size cap and reject unknown fields,
// fields of the wrong type, trailing data and empty bodies, so a client mistake is a 400 that names
// the field rather than a silently ignored parameter. Every error they return is an *Error that
// WriteError can send as is.
//
// # Concurrency
//
// Decoded values and response types are plain data. An SSEWriter or SSEReader belongs to one
// goroutine.
//
// # Zero value
//
// The zero values of the request and response types are empty messages. The zero SSEWriter and
// SSEReader are not usable; build them with NewSSEWriter and NewSSEReader.
package openai
