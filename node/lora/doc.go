// Package lora loads LoRA adapters on demand onto one node's engine: the adapters of a source
// (ReadSource: a directory of adapters, or a JSON map of name to path or URI) are valid
// wherever their base model is served, and a request for one that the engine has not loaded
// loads it first, through the engine's runtime API (a Runtime).
//
// # Contract
//
//   - Acquire loads the adapter unless the engine holds it, then holds it in use until the
//     release it returns is called. Loads are single-flight per adapter: two concurrent first
//     requests cause one load, and the second waits for it. A wait is bounded by the caller's
//     context and by Config.Timeout, which also bounds the load.
//   - When the engine holds Config.Capacity adapters, a load first unloads the least recently
//     used source adapter that no request holds (an eviction); with none idle, Acquire fails
//     with ErrNoIdleSlot. Adapters the engine lists that are not in the source (loaded at its
//     start) take room but are never unloaded.
//   - SetSource replaces the source (a reload): a new entry loads at its first request; an
//     adapter the loader loaded that the new source drops stays until it is evicted, and is
//     not loaded again: a request that waited for a flight and then finds the engine without
//     it and its entry gone fails with ErrNotInSource.
//   - Failures are *Error values naming the adapter, wrapping ErrLoadFailed, ErrLoadTimeout,
//     ErrNoIdleSlot or ErrNotInSource.
//   - A Trace in Acquire's context (WithTrace) is told that call's steps: its wait for
//     another's flight, the unload it made room with, the load it ran.
//   - Expected is the load time a request for an adapter should count before its first token:
//     zero when the engine holds it, else the mean of recent loads (Config.LoadEstimate before
//     the first).
//
// It opens no socket and starts no goroutine: a load runs on the goroutine of the request that
// started it, under a context of its own (bounded by Config.Timeout, not cancelled with that
// request, since others may wait for it). Its clock is Config.Now, and the bounds' timers.
//
// # Concurrency
//
// A Loader is safe for concurrent use. Runtime and Config's functions are called without the
// Loader's lock held.
package lora
