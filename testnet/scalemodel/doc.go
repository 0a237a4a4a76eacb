// Package scalemodel predicts what kvmesh's gossip costs and delivers on meshes larger than a
// testnet can hold: a new prefix's visibility across its model's domain (p50, p99), state
// records' age, gossip bytes per node and the prefix index's memory per node. cmd/scalemodel
// prints its table; docs/performance.md carries it.
//
// # The rule it implements
//
// A discrete-event simulation of memberlist's dissemination as kvmesh uses it, one event per
// node tick, deterministic for a seed:
//
//   - Every GossipInterval each node (at its own phase) runs memberlist's gossip step over the
//     whole mesh (state records, one packet of PacketBytes to each of GossipNodes random
//     members) and kvmesh's over its prefix domain (deltas, each target its share of the byte
//     budget, one message a packet). A message is taken fewest transmissions first, newest
//     first within a tier (memberlist also prefers the largest of a tier; the model does not),
//     and leaves a queue after RetransmitMult × ceil(log10(n+1)) transmissions, n the members
//     the queue serves (the mesh for records, the domain for deltas).
//   - All of a node's sends draw on one token bucket of MaxBytesPerSecond (counting 2 bytes a
//     message, as kvmesh's counter does); a send past it waits for the next tick.
//   - Every FlushInterval a node cuts its pending block changes (Churn stored and as many
//     evicted a second) into messages of at most MaxMessage bytes, and prunes each queue to two
//     seconds of budget, dropping the most transmitted first. Every PublishInterval it
//     publishes a record of RecordBytes, which replaces its previous one in every queue.
//   - A receiver applies a message it has not seen and relays it from its next tick on;
//     HopLatency (the network and the receiver's processing) separates a send from the
//     arrival.
//
// Probes (a new 2,048-token prefix: 128 blocks, in messages of its own) are stored at random
// nodes during the measured window; a probe is visible when every other member of its domain
// holds all of it. Record age is sampled over random (viewer, origin) pairs once a simulated
// second. Memory is computed, not simulated: every domain peer at its residency, at
// EntryBytes per (peer, block) entry and DistinctBytes per distinct hash.
//
// Not modelled: memberlist's own traffic (probes, suspicion and alive messages) and
// push/pull exchanges (which repair residency and records every PushPullInterval, scaled by
// log2 of the mesh above 32 members); packet loss; CPU. The inputs a measurement should fit
// (HopLatency, RecordBytes, PacketOverhead, EntryBytes, DistinctBytes) are explicit.
//
// # Concurrency
//
// Run is a pure function of its Config; it may be called concurrently.
package scalemodel
