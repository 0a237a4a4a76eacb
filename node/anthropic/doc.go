// Package anthropic is kvmesh's Anthropic Messages API (POST /v1/messages and
// /v1/messages/count_tokens): it decodes a Messages request, translates it into the equivalent
// chat completions body, and translates the chat answer (a completion, an OpenAI-shaped
// error, or a chat stream) back into the Messages API's answer, error and streaming events.
//
// The node runs the translated body through its chat path, so a Messages request is admitted,
// prioritised, routed on its prefix, forwarded, migrated and counted as the equivalent chat
// request is: the prompt kvmesh hashes is the chat messages' (ToChat), and a Messages
// conversation and the same conversation sent as chat share their prefix blocks.
//
// # Decoding
//
// Decode reads the members of the Messages API's reference: model, messages (user and
// assistant turns of text, image, tool_use and tool_result blocks), system, max_tokens,
// stop_sequences, temperature, top_p, top_k, stream, tools (client tools), tool_choice,
// metadata.user_id and service_tier. A member or block type kvmesh knows and does not carry
// (thinking, mcp_servers, server tools, document blocks, ...) is refused by name, as is any
// other member: a 400 whose param is the member's path (messages.0.content.1.type).
//
// # Errors
//
// ErrorOf maps kvmesh's statuses and codes to the Messages API's error types and statuses;
// overload (429 other than the key's own rate limit, and 503) is 529 overloaded_error.
//
// # Concurrency
//
// Decoded requests and responses are plain data. A ResponseWriter belongs to the goroutine of
// its request.
//
// # Zero value
//
// The zero Request is an empty request. The zero ResponseWriter is not usable; build one with
// NewResponseWriter.
package anthropic
