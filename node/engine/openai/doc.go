// Package openai drives an external OpenAI-compatible inference server (vLLM, SGLang,
// llama.cpp's server, TGI, or any plain OpenAI-compatible endpoint) as an engine.Engine.
//
// Generate forwards the client's JSON body byte for byte but for streaming and usage reporting,
// forced on (ForceStreaming), so fields kvmesh does not read reach the server as sent, and
// turns the server-sent chunks into engine.Chunks (text, logprobs, usage). Start begins a loop that scrapes the server's
// Prometheus /metrics on an interval and maps the metric names of Config.Kind into an
// engine.State:
//
//   - Waiting, Running: the kind's waiting and running request gauges (kind "openai", which has
//     no metrics, reports the requests this Engine has in flight as Running).
//   - KVBlocksTotal: from cache_config_info (vLLM block_size × num_gpu_blocks, SGLang
//     page_size × num_pages) converted to blocks of Config.BlockTokens; otherwise
//     Config.NominalKVBlocks. KVBlocksUsed is the kind's KV usage fraction × KVBlocksTotal.
//   - HitRate: vLLM's prefix_cache_hits / prefix_cache_queries over the interval between two
//     scrapes; SGLang's cache_hit_rate gauge; 0 for the others.
//   - QueuedPrefillTokens: no engine exports it, so it is estimated as Waiting ×
//     Config.AvgPromptTokens.
//   - PrefillTokensPerSecond, DecodeStepSeconds, MaxRunning: passed through from Config.
//   - Healthy: false until the first good scrape and after Config.MaxScrapeFailures failures in
//     a row. A scrape that finds none of the kind's request gauges counts as a failure, since it
//     means the kind is misconfigured.
//
// # Concurrency
//
// An Engine is safe for concurrent use. A Stream belongs to one goroutine, but Close may be
// called from another.
//
// # Zero value
//
// The zero Engine is not usable; build one with New.
package openai
