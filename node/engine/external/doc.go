// Package external drives an external OpenAI-compatible inference server (vLLM, SGLang,
// llama.cpp's server, TGI, or any plain OpenAI-compatible endpoint) as an engine.Engine.
//
// Generate forwards the client's JSON body byte for byte but for the members the node owns:
// streaming and usage reporting, forced on (ForceStreaming), the output cap admission decided
// (setMaxTokens) and priority, the node's or none (SetPriority, dropPriority); so fields
// kvmesh does not read reach the server as sent. It turns the server-sent chunks into
// engine.Chunks (text, logprobs, usage). Start begins a loop that scrapes the server's
// Prometheus /metrics on an interval and maps the metric names of Config.Kind into an
// engine.State:
//
//   - Waiting, Running: the kind's waiting and running request gauges, summed over their series
//     (SGLang's per-priority series beside the total are dropped); kind "openai", which has no
//     metrics, reports the requests this Engine has in flight as Running.
//   - KVBlocksTotal: the server's KV size (vLLM's cache_config_info kv_cache_size_tokens, else
//     block_size × num_gpu_blocks; SGLang's page_size × num_pages, else max_total_num_tokens)
//     converted to blocks of Config.BlockTokens; otherwise Config.NominalKVBlocks (llama.cpp,
//     TGI). KVBlocksUsed is the kind's KV usage fraction × KVBlocksTotal (0 for TGI and recent
//     llama.cpp, which export none).
//   - HitRate: vLLM's prefix_cache_hits / prefix_cache_queries over the interval between two
//     scrapes; SGLang's cache_hit_rate gauge; 0 for the others.
//   - QueuedPrefillTokens: no engine exports it; it is the prompt tokens this Engine sent the
//     server and has not seen the first token of, less each prompt's prefix the residency model
//     predicts cached.
//   - PriorityScheduling, QueuedBeforeHigh, QueuedLowWaiting: with Config.Priority (vLLM
//     only), which also sends each request's priority (SetPriority). The split of the queued
//     prefill is an estimate: the earliest dispatched prompt counts as the one the server is
//     prefilling, ahead of every class; the others wait in their class.
//   - PrefillTokensPerSecond: learned from the prompt-token and cache-hit counters over
//     intervals in which requests waited (measurePrefillLocked), unless Config sets it. TGI
//     has no such counter.
//   - DecodeStepSeconds, MaxRunning: passed through from Config; no engine's metrics export
//     them (vLLM's max_num_seqs is in none of its families), so the operator gives MaxRunning.
//   - Healthy: false until the first good scrape and after Config.MaxScrapeFailures failures in
//     a row. A scrape that finds none of the kind's request gauges counts as a failure, since it
//     means the kind is misconfigured. Also false while the model list is (below).
//
// # Models
//
// The models served come from the server's GET /v1/models, read at Start and every
// Config.ModelsInterval: every model it lists, or, when Config.Models names some, those of them
// it lists. A model's context is the entry's max_model_len (vLLM sends it), else the configured
// one, else Config.DefaultContextTokens. Start fails (ErrModelNotServed) when the server
// answers without a configured model; a server that does not answer does not fail Start but
// leaves the engine unhealthy until a fetch succeeds (retried every ScrapeInterval), so a node
// may start before its engine has loaded. The engine is unhealthy while it cannot fetch the
// list (from the first failure before any success, after MaxScrapeFailures in a row later) and
// while it serves no model; Health says why.
//
// # Errors
//
// An HTTP error before the first token is a *StatusError. Its APIError keeps a 4xx's status,
// message, param and string code for the client (a code by status when the engine sends
// none), and makes a 5xx, or the engine refusing the node's credentials (401, 403), a 502
// engine_error.
//
// # Residency
//
// The Engine keeps a model (package residency) of what the server's prefix cache holds: the
// chained blocks of the prompts it sent there, stored at each request's first token and evicted
// least recently used first at the server's KV size (KVBlocksTotal), corrected by each
// response's usage.prompt_tokens_details.cached_tokens. Config.OnPrefix receives its stored and
// evicted blocks and the anchors among them, ResidentBlocks its full contents and
// ResidentAnchors its anchors, as the embedded engine reports its exact cache. A restart of
// the server (its process_start_time_seconds changed, its prompt token counter went back, or
// its health failed and returned) empties the model, once: the new instance's figures are
// judged against its own, not the old one's.
//
// With Config.KVEvents the Engine also reads the server's KV cache events (package kvevents)
// on its loop's lifetime: a clear empties the model, removals evict its least recently used
// blocks, and the server's stored-block count caps it while that count is exact (kvevents.go
// says what the events can and cannot tell).
//
// # Continuations
//
// A request with engine.Request.Resume continues a generation another node lost mid-response;
// its body, which the node built, already ends with the text sent. Chat continuations tell
// the server to continue the final assistant message rather than answer it: vLLM's
// "continue_final_message": true with "add_generation_prompt": false, SGLang's and TGI's
// "continue_final_message": true; llama.cpp's server continues a final assistant message by
// default, and a plain OpenAI-compatible server has no such flag. A client's min_tokens is
// reduced by the tokens sent before. The usage reported counts the whole generation: the
// tokens sent before are added to the completion and taken off the prompt.
//
// # Tracing
//
// Each call to the server sends the W3C trace context of the caller's context in traceparent
// and tracestate, from a client span on the pipeline of the caller's span (vLLM continues the
// trace with --otlp-traces-endpoint). With a no-op tracer the caller's own trace context, a
// client's traceparent, passes through unchanged, and a request without one gets none.
//
// # Concurrency
//
// An Engine is safe for concurrent use. A Stream belongs to one goroutine, but Close may be
// called from another.
//
// # Zero value
//
// The zero Engine is not usable; build one with New.
package external
