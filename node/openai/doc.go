// Package openai holds kvmesh's OpenAI wire format: the request types of
// POST /v1/chat/completions and POST /v1/completions with strict decoding, the response and
// streaming-chunk types, OpenAI-shaped error bodies, and server-sent events in both directions.
//
// # Decoding
//
// DecodeChat and DecodeCompletion read a whole body under a size cap, member by member. The
// members kvmesh reads (model, messages or prompt, max_tokens, max_completion_tokens, stream,
// stream_options.include_usage, stop, n, temperature, top_p, seed, user, logprobs,
// top_logprobs, echo) are matched by exact name and decoded strictly, so a wrong type is a 400
// that names the field. Every other member (an OpenAI field kvmesh leaves to the engine, or an
// engine's own such as vLLM's top_k or guided_json) is kept with its value as sent in the
// request's Extra (stream_options' in its own), for the engine to honour or refuse: kvmesh
// neither refuses nor silently drops it. Messages keep their role, their text and, as sent,
// their content parts of other types (images, audio, files); the images and audio also as
// Media, with their sources and places in the text, which must be strings. Messages' other
// members, like any role name, are the engine's business. Trailing data, empty bodies and
// non-objects are refused. Every error they return is an *Error that WriteError can send as is.
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
