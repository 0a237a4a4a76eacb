// Package kvindex is kvmesh's prefix knowledge: the rule that turns a prompt into chained KV
// block hashes, a per-peer index of which blocks each peer's engine holds, the longest
// contiguous prefix lookup, and the binary encoding of prefix summaries that travel in gossip.
//
// It is a pure library: no sockets, no goroutines, no clock of its own.
//
// # Prefix rule
//
// A prompt is text (chat messages are rendered by RenderChat). Tokens are BytesPerToken bytes.
// The text is cut into blocks of blockTokens tokens; block i's hash covers the whole prefix
// before it, so a peer can reuse block i only if it holds blocks 0..i. The model name seeds the
// chain. A chat message's images and audio clips (Part) are rendered at their places as
// placeholders, text derived from the part's identity (PartID) alone and as long as its token
// estimate (ImageTokens, AudioTokens), so they chain and count as that many tokens of text. The embedded engine (node/engine/sim) uses these same functions, so a request's blocks
// and an engine's residency match exactly.
//
// # Calibration
//
// Calibration learns, per model, how many prompt bytes an engine's real tokeniser makes one
// token, from the engine's counts of finished prompts, so that a prompt's token count (for the
// context budget, KV need and latency predictions) follows the model. It changes counting only:
// the block rule above stays at BytesPerToken on every node.
//
// # Index
//
// Index holds, per peer, the confirmed block hashes its engine reported (LRU-bounded by
// IndexConfig.MaxBlocksPerPeer) and speculative ones an ingress just forwarded there (valid
// until their expiry, superseded by confirmation). LongestPrefix scores a request's blocks
// against every peer at once: the score is the contiguous run of anchors from block 0.
//
// # Anchors
//
// Routing needs long shared prefixes, not block precision, so only a chain's anchors travel
// in gossip and are matched: block positions 0, 1, 3, 7, 15, 31, 63, then every AnchorStride
// (Anchor). Engines keep exact residency and report the anchors apart (CacheDelta). A match
// undercounts by at most AnchorStride−1 blocks; past the head, gossip and the index carry one
// block in AnchorStride.
//
// Memory is bounded per peer: at most MaxBlocksPerPeer confirmed blocks (past it, the least
// recently added is forgotten first) and as many speculative ones (past it, the oldest
// addition goes first; all go at expiry). Stats reports the entries and an estimate of their
// heap (EntryBytes, DistinctBytes, SpecEntryBytes): a peer at the default cap holding blocks no
// other peer holds costs about 10 MiB, one whose blocks are all shared about 3 MiB.
//
// # Summaries
//
// Summary is the wire form of a peer's residency change (delta) or full residency
// (snapshot); DecodeSummary is strict and never panics.
//
// # Concurrency and zero value
//
// An Index is safe for concurrent use; create it with NewIndex (the zero Index is not
// usable). A Calibration is safe for concurrent use; create it with NewCalibration. Summary is
// a plain value. The hashing functions are pure.
package kvindex
