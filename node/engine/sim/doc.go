// Package sim is kvmesh's embedded engine: a simulated GPU running a vLLM-like server, close
// enough that admission and routing policies show what they show in production (queueing
// delay, the goodput cliff past saturation, prefix-cache reuse, eviction, preemption), on a
// machine without a GPU.
//
// # Model
//
// One goroutine runs the engine step by step (continuous batching). Each step schedules the
// running sequences first, in priority then arrival order (one decode token each, or the next
// prefill chunk), then admits waiting sequences from the head, all under a token budget
// (MaxNumBatchedTokens) and a cap on running sequences (MaxNumSeqs). A step lasts
//
//	StepFixed + StepPerToken·(tokens computed) + StepPerContextToken·(context tokens in the batch)
//
// of simulated time and sleeps that divided by TimeScale. A sequence emits a token at the end of
// every step after which its whole context is computed, so TTFT is queueing plus the prefill
// steps, and each later token costs one step.
//
// The KV cache is a pool of KVBlocks blocks of BlockTokens tokens. A request's full prompt
// blocks are named by kvindex's chained hashes; at admission the longest run of them cached
// from block 0 is reused (CachedTokens) and not recomputed. When a prefill completes its prompt
// blocks become cached (reported to OnPrefix as stored). Cached blocks no running request
// holds stay resident and are evicted least recently used first, a released prefix tail
// first, when space is needed (reported to OnPrefix as evicted); blocks passed to Demote (a
// prefix its owner is done with) go before all others. A cached block keeps its place in the
// chain it was stored from, so reports and ResidentAnchors can tell its anchors
// (kvindex.Anchor), all that gossip carries. When a running sequence needs a block
// and none can be had, the running sequence of lowest priority, latest arrival among those,
// is preempted: its blocks are freed, it returns to the front of its priority in the waiting
// queue and its context (prompt and output so far) is recomputed when it is readmitted.
//
// # Priority
//
// Request.Priority (higher first) orders the scheduler, modelled on vLLM's
// --scheduling-policy priority: the waiting queue is sorted by priority then arrival (first come first served within
// a priority), running sequences take the budget in priority then arrival order, and
// preemption takes the lowest priority, latest arrival first. When the head of the waiting
// queue cannot get its blocks, running sequences of strictly lower priority are preempted for
// it, lowest first, and it is admitted in that step; nothing is preempted when that would not
// make room, and never one of equal or higher priority. With all priorities equal the
// schedule is the first-come-first-served one, step for step. State reports
// PriorityScheduling and what of QueuedPrefillTokens is ahead of a high request
// (QueuedBeforeHigh) and what a normal one goes before (QueuedLowWaiting).
//
// Config.SchedulingPolicy mirrors vLLM's --scheduling-policy: SchedulingPriority, the default,
// is the above; SchedulingFCFS (vLLM's and SGLang's default) ignores Request.Priority by
// scheduling every request at priority 0, which makes the schedule first come, first served:
// arrival order, no preemption for a waiting request, the latest arrival preempted first.
// State then reports no PriorityScheduling and leaves the class split zero.
// docs/design/engine.md has the rules, and how an external vLLM is sent the priority.
//
// # Roles
//
// Config.Role splits a request between two engines (disaggregated prefill and decode,
// roles.go): a prefill engine computes the prompt's KV and ends the request with an
// engine.Handover in its final chunk (FinishHandover, no token); a decode engine takes the
// request with that handover, holds the prompt's blocks from its admission, waits
// Handover.KVBytes / LinkGBps for the KV to cross the link, then decodes as a mixed engine
// does, the same text. The default, mixed, runs whole requests and also decodes
// handovers. docs/design/engine.md#roles has the model.
//
// # LoRA adapters
//
// The engine serves LoRA adapters of its first model (lora.go): those of Config.LoRAModules and
// those LoadAdapter adds. A request naming one runs on the base model; a batch holds at most
// MaxLoRAs distinct adapters, a waiting request whose adapter cannot join is skipped, bringing
// an adapter into a slot (evicting the least recently batched idle one) adds LoRALoadTime to
// the step, and each distinct adapter in a step adds StepPerLoRA. Block hashes are seeded by
// the adapter's name, so its prefix cache is its own.
//
// # Text
//
// Tokenisation is kvindex's: 4 bytes per token. Output is deterministic per request: token i
// is a 4-byte word ("the ", "and ", ...) picked by splitmix64 from a seed mixing req.Seed with
// the prompt's hash. 70% of requests run to MaxTokens (finish "length"); the other 30% end on
// their own after a uniform 1..MaxTokens tokens (finish "stop" when below MaxTokens). Stop
// sequences end the output with "stop"; text that could be the start of a stop string is held
// back until it cannot be, so a stop string split across tokens is never sent.
//
// A request with Request.Resume continues the text of the generation it resumes (resume.go):
// the words of the original's seed and prompt, from the original's stop-filter state where the
// client's stream stopped, under the original's MaxTokens, so the continuation sends exactly
// the rest of an unbroken run; its Usage counts the whole generation.
//
// With Request.Logprobs every output token is scored: the token is the likeliest of its
// position, the other words trail it by gaps drawn from the seed, so log probabilities are
// below 0, the TopLogprobs listed are in descending order and start with the token, and a
// request's logprobs repeat with its seed. Request.Echo (completions) puts the prompt before
// the output in the first chunk, with its tokens (4 bytes each, stretched to a character
// boundary; the first unscored) before the output's.
//
// # Request fields
//
// The fields the node does not read (Request.Extra) are never ignored silently (params.go):
// sampling knobs, template switches and bookkeeping (top_k, min_p, repetition_penalty,
// chat_template_kwargs, skip_special_tokens, tools with tool_choice auto, ...) are accepted as
// no-ops once their type is right; min_tokens, ignore_eos and include_stop_str_in_output are
// honoured, and so is a tool_choice that forces a function: the answer is one call to it
// (tools.go); a value the simulator cannot keep (guided_json, a json_schema response_format, a
// forced function_call, best_of above 1, token ids, ...), a field it does not know, and a role
// outside OpenAI's chat API are refused with an *engine.ParamError naming the field. Image and
// audio parts run as the placeholders the node rendered into the prompt for them (kvindex.Part),
// so a repeated image hits the prefix cache; other content parts are refused.
//
// # Embeddings
//
// Embedding gives deterministic pseudo-embeddings (EmbeddingDims values of unit length, seeded
// by the model and the text) so that a mesh on the embedded engine serves POST /v1/embeddings
// end to end. They are computed at once, outside the simulated batch: an embeddings request
// takes no simulated GPU time and no KV blocks. The vectors carry no meaning.
//
// # Calibration
//
// The defaults model Llama-3.1-8B in BF16 on one H100 SXM 80 GB, worked from first principles
// (docs/design/engine.md says why the step budget is sized to the TPOT SLO):
//   - weights: 8.03e9 parameters × 2 bytes ≈ 16.06 GB (Meta's published parameter count);
//   - KV per token: 2 (K,V) × 32 layers × 8 KV heads × 128 dims × 2 bytes = 128 KiB (the
//     model's published architecture: grouped-query attention with 8 KV heads);
//   - pool: (80 GiB × 0.9 gpu_memory_utilization − weights) / (128 KiB × 16) ≈ 29.2k blocks;
//   - StepFixed 5 ms: a step reads all weights once, 16 GB at the H100's ~3.35 TB/s HBM bandwidth;
//   - StepPerToken 30 µs: ~16 GFLOP per token at ~55% of the H100's 989 dense BF16 TFLOP/s,
//     which gives ≈ 31k prompt tokens/s for a full 2048-token prefill step (33k at 8192);
//   - StepPerContextToken 40 ns: reading 128 KiB of KV per context token at 3.35 TB/s.
//
// As a check, 256 sequences of 1k context decode at ≈ 11k tokens/s, the order of the ~12.5k
// output tokens/s published for vLLM on this pair at high concurrency.
//
// # State and metrics
//
// State reports KV use as vLLM's kv_cache_usage_perc does (blocks held by running sequences
// over the pool; CachedBlocks counts the prefix cache separately), a hit rate over the last
// HitRateWindow prompt tokens looked up, the modelled prefill throughput of a full step and
// the modelled decode step time of the current batch, both in scaled (real) seconds. The
// vLLM-named metrics are read at scrape time by one collector per Sim; latency histograms are
// wall-clock (so they scale with TimeScale); Stream.Timing gives unscaled simulated latency.
//
// # Concurrency
//
// All methods of Sim are safe for concurrent use. A Stream belongs to one reader; its Close may
// be called from any goroutine. The step loop never blocks on a reader: each stream buffers
// its output (at most MaxTokens chunks). OnPrefix runs on the step loop goroutine without
// the Sim's lock held.
//
// # Zero value
//
// The zero Sim is not usable; create one with New. New starts no goroutine: the loop starts on
// Start or the first Generate, and Close stops it and fails in-flight streams with ErrClosed.
package sim
