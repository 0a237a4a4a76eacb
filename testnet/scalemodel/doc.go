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
//     sends its pending changes, whole, directly to every other member of its domain, in
//     messages of MaxPayload bytes (DeltaHeader of them the header; PacketOverhead more, as
//     the budget counts it), and no receiver relays them. A round goes while the node's
//     bucket (one second of MaxBytesPerSecond) is above zero and may overdraw it by two
//     seconds' worth; below zero the changes wait, and a stored block still pending when its
//     eviction comes (Resident/Churn seconds later) goes as one eviction. A round costing more
//     than two seconds of budget is dropped (Dropped) and the domain's members are resynced,
//     each sent the node's residency, as many a round as the bucket allows.
//   - State records: a node publishes one every PublishInterval; one every mesh interval
//     (MeshInterval, gossip's) goes through memberlist: every GossipInterval each node sends
//     one packet of PacketBytes to each of GossipNodes random members, fewest transmissions
//     first, a record leaving the queue after RetransmitMult × ceil(log10(n+1)) sends and
//     relayed by whoever takes it as new. Once the mesh interval is longer than
//     PublishInterval, each record also goes straight to the node's domain members with its
//     next prefix round, ahead of the deltas, and a peer outside the viewer's domain is stale
//     only past three mesh intervals. Records draw on the same bucket as deltas.
//   - Push/pull: every PushPullInterval (scaled by log2 of the mesh above 32 members) a node
//     exchanges records and residency with a random member (kept inside a domain only).
//   - HopLatency (the network, the receiver's processing and, in BenchmarkScale, its 5 ms
//     polling) separates a send from its use.
//
// The mesh starts converged (every node took every record at time 0) and is measured after
// Warmup, at least two mesh intervals. Probes (a new 2,048-token prefix: its 8 anchors) are
// stored at random nodes during the measured window, spread evenly or, with ProbeGap, one
// after another as BenchmarkScale stores them; a probe is visible when every other member of
// its domain holds it. Record ages are kvmesh's (since the viewer took the origin's newest
// record), sampled once a simulated second over pairs in one domain and pairs across domains.
// Bytes are counted as kvmesh's metrics count them. Computed, not simulated: the join burst
// (every domain peer's anchored residency, and record) and the index's memory (every domain
// peer's anchored residency and the probes' anchors at EntryBytes + DistinctBytes a block, no
// block shared).
//
// Not modelled: memberlist's own traffic (probes, suspicion and alive messages, the member
// list in push/pull), structural changes (records sent at once), MinPublishInterval, joins
// and deaths during the run, packet loss, CPU. The inputs fitted on BenchmarkScale
// (HopLatency, RecordBytes, DeltaHeader, PacketOverhead, EntryBytes, DistinctBytes) are
// explicit, and docs/performance.md compares the fit with the measurements.
//
// # Concurrency
//
// Run is a pure function of its Config; it may be called concurrently.
package scalemodel
