// Package kvevents reads and writes inference engines' KV cache events: what vLLM and SGLang
// publish with --kv-events-config when their prefix cache stores blocks, evicts them, or is
// cleared.
//
// # The format
//
// A ZeroMQ PUB socket sends one multipart message per engine step: [topic, sequence number
// (8 bytes, big-endian, from 0 when the publisher starts), payload]. The payload is a msgpack
// KVEventBatch: an array [ts, events, data_parallel_rank...] (or, in some versions, a map with
// the same names), whose events are tagged arrays ["BlockStored", block_hashes,
// parent_block_hash, token_ids, block_size, lora_id, medium, ...], ["BlockRemoved",
// block_hashes, medium, ...] and ["AllBlocksCleared"] (vLLM up to 0.22, SGLang), or maps with
// the tag under "type" and the same field names (later vLLM). Block hashes are integers or byte
// strings, by version. DecodeBatch reads all of these, skips the fields it does not need and
// those newer versions add, and refuses anything else with ErrMalformed; it does not panic,
// allocate beyond its input, or recurse without bound on any input (FuzzDecodeBatch).
//
// # Subscriber
//
// A Subscriber dials one publisher (tcp://host:port), or binds for publishers that dial it
// (bind:tcp://host:port, BindPrefix), subscribes to a topic prefix, and hands each decoded
// Batch to its OnBatch, in order. It follows the sequence numbers: a batch after a gap, after
// a message it could not decode, or the first one of a connection past 0 and past the last one
// read says Missed; a number that goes back, or a connection's first one numbered 0, says
// Restarted (a publisher read from its start, whose engine's cache was empty then). A lost
// connection is dialled again after RetryInterval; a bound subscriber listens on. Frames
// longer than MaxFrameBytes end the connection (zmq4 would allocate them whole), and the
// handshake is bounded in time, dialled or accepted. Each SilentAfter without a message is
// counted and logged at a rate that falls as the silence lasts (silentLogged). It exports
// kvmesh_engine_kv_events_total{type}, kvmesh_engine_kv_event_gaps_total,
// kvmesh_engine_kv_event_decode_errors_total, kvmesh_engine_kv_event_silences_total and
// kvmesh_engine_kv_events_connected.
//
// # Publisher
//
// A Publisher listens and sends batches in the array-shaped format (EncodeBatch), for kvmesh's
// own engine served alone. Publish queues and returns; a slow subscriber loses messages past
// the high-water mark, as with the engines.
//
// # Concurrency
//
// Run blocks until its context ends, and must not be called twice at once; Addr is safe
// beside it. A Publisher is safe for concurrent use. The zero values are not usable: build them with NewSubscriber and
// NewPublisher, which do no I/O.
package kvevents
