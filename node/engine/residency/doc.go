// Package residency models which prompt blocks an external inference engine holds in its
// prefix cache, for a node that cannot see that cache: the node's own record of the prompts it
// sent the engine, evicted least recently used first at the engine's KV capacity, and corrected
// by what the engine reports afterwards (usage.prompt_tokens_details.cached_tokens).
//
// # The model
//
// A Model holds block hashes (kvindex's chained hashes of kvmesh's own text chunking, not the
// engine's token ids), at most Capacity of them. Its life with one request:
//
//   - Predict, at dispatch: the prompt's run of blocks held from block 0, capped as an engine
//     caps a hit (at least one prompt token is always computed).
//   - Acquire, at the first token: the engine has computed the prompt, so every full block is
//     in the cache and pinned while the request runs (a running request's blocks cannot be
//     evicted); its partial last block takes room too.
//   - Release, at the end: the output's blocks took room while it ran (least recently used
//     blocks make way for them), then the prompt's blocks become evictable, refreshed tail
//     first so that block 0 is the most recent and a prefix is evicted from its end, as vLLM
//     and kvmesh's own engine do.
//   - Correct, with the engine's usage: the prediction against the engine's cached_tokens.
//     Reported fewer: the engine had evicted blocks the model still held. An engine evicts least
//     recently used first, so it has also evicted every block the model last used no later
//     than the first missing one: those leave the model (the prompt's own blocks stay, since
//     the request just stored them again). Reported more: the model missed a store (a request
//     it did not see, or its capacity is smaller than the engine's): the reported blocks of the
//     prompt enter it.
//
// When the engine says what it evicted (its KV cache events), EvictOldest evicts as many of
// the least recently used blocks, and Cap evicts them down to the number the engine says it
// holds; neither touches a running request's blocks.
//
// Every change is returned as a Delta of stored and evicted hashes, for the node to gossip:
// each block keeps its place in the chain it entered from, so a Delta and ResidentAnchors
// name the anchors among them (kvindex.Anchor), all that gossip carries.
// Clear empties the model when the engine restarted; predictions and holds from before it
// change nothing afterwards.
//
// # Units
//
// Blocks are kvmesh blocks of BlockTokens kvmesh tokens (4 bytes of text each). The engine counts
// its own tokens: Correct scales its report by the ratio of its prompt count to kvmesh's and
// rounds the prediction down to the engine's block size (what the engine can report), so a
// prediction is of a token-count prefix, not of the engine's exact blocks. When the two counts
// of the prompt differ (a real tokenizer), a shortfall of less than one engine block is taken
// for the boundary between two tokenisations, not for an eviction.
//
// # Concurrency
//
// A Model is not safe for concurrent use: its owner locks around it. It starts no goroutine and
// reads no clock; the order of calls is its time.
//
// # Zero value
//
// The zero Model is not usable; build one with New.
package residency
