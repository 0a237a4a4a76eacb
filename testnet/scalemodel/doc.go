// Package scalemodel predicts what kvmesh's gossip costs and delivers on meshes larger than a
// testnet can hold: a new prefix's visibility across its model's domain (p50, p99), state
// records' age, gossip bytes per node, a joiner's snapshot burst and the prefix index's
// memory per node. cmd/scalemodel prints its table; docs/performance.md carries it.
//
// # The rule it implements
//
// A discrete-event simulation of kvmesh's anchored prefix gossip and of memberlist's
// dissemination of state records, one event per node timer, deterministic for a seed:
//
//   - Prefix deltas: only anchor blocks are gossiped (IsAnchor), so a node's anchor changes
//     are its engine's Churn stored and as many evicted a second, times AnchorFraction (the
//     Mooncake trace's, CountTraceBlocks). Every PrefixInterval (at its own phase) a node
//     sends its pending changes, oldest first, directly to every other member of its domain,
//     in packets of MaxPayload bytes (DeltaHeader of them the header; PacketOverhead more on
//     the wire), and no receiver relays them. A round spends at most its share of the budget
//     (MaxBytesPerSecond × PrefixInterval) and what the node's token bucket holds; the rest
//     waits, a stored block still pending when its eviction comes (Resident/Churn seconds
//     later) cancels with it, and a backlog that would cost over two seconds of budget is
//     dropped (Dropped), left to push/pull.
//   - State records: every GossipInterval each node runs memberlist's gossip step over the
//     whole mesh, one packet of PacketBytes to each of GossipNodes random members, fewest
//     transmissions first, a record leaving the queue after RetransmitMult × ceil(log10(n+1))
//     sends; every PublishInterval a node publishes a record of RecordBytes, which replaces
//     its older one in every queue. Records draw on the same token bucket as deltas.
//   - Push/pull: every PushPullInterval (scaled by log2 of the mesh above 32 members) a node
//     exchanges records and, inside a domain, anchored snapshots with a random member.
//   - HopLatency (the network and the receiver's processing) separates a send from its use.
//
// Probes (a new 2,048-token prefix: its 8 anchors) are stored at random nodes during the
// measured window; a probe is visible when every other member of its domain holds it. Record
// age is sampled over random (viewer, origin) pairs once a simulated second. Computed, not
// simulated: the join burst (every domain peer's anchored snapshot, in packets) and the
// index's memory (every domain member's anchored residency at EntryBytes + DistinctBytes a
// block, no block shared).
//
// Not modelled: memberlist's own traffic (probes, suspicion and alive messages, the member
// list in push/pull), joins and deaths during the run, packet loss, CPU. The inputs a
// measurement should fit (HopLatency, RecordBytes, PacketOverhead, EntryBytes,
// DistinctBytes) are explicit.
//
// # Concurrency
//
// Run is a pure function of its Config; it may be called concurrently.
package scalemodel
