// Package gossip is kvmesh's mesh membership over hashicorp/memberlist (SWIM): who is alive,
// each node's state record (load, capacity, GPU, carbon) and which KV prefix blocks each
// node's engine holds.
//
// # Messages
//
// Every kvmesh message starts with a version byte and a kind. A state record (EncodeState:
// tagged fields, unknown tags skipped, another major version refused) is broadcast when it
// changes (at most every MinPublishInterval) and at least every PublishInterval, through
// memberlist's gossip, to the whole mesh. Prefix deltas from PrefixStored and PrefixEvicted are
// coalesced for PrefixInterval into kvindex summaries cut to fit one UDP packet, and sent
// straight to every alive member of this node's prefix domains (a model's domain is the alive
// members whose record serves it), which apply them and relay nothing: each member receives
// each delta once, from its origin, and a node's cost grows with its domains, not the mesh. A
// member that has not been sent this node's residency since it appeared (joined, restarted,
// back from dead, newly in a domain) is sent all of it. State records and prefix rounds share
// the MaxBytesPerSecond budget. The push/pull sync (with a random member of the whole mesh)
// carries this node's record and a full residency snapshot, which repairs lost deltas and
// brings new members up to date; a snapshot from outside every domain is not kept.
// MembersServing reads an index of members by model kept as records change.
// Messages of an unknown version or malformed bytes are dropped and counted in
// kvmesh_gossip_dropped_messages_total{reason}; decoders never panic.
//
// # Restarts and failures
//
// Every process has a random boot id in its record. A dead or left member's prefixes are
// dropped from the index; a new boot id drops the old residency and retires the old id, so a
// late message of the previous process cannot resurrect it; a retired id whose successor has
// been silent for the stale age is taken back, so no boot id locks a live process out.
// Member.Incarnation counts boots. A record names its origin's gossip address: one from
// another address than memberlist holds for the member is a second process with its name
// (a cloned host) and is refused, and a process whose join finds its name held by a live
// member refuses to start (ErrNameConflict); both sides log and count it (conflict.go).
// Every PushPullInterval a member joins again one member it holds dead, so that the two sides
// of a healed network partition, each holding the other dead, merge again. Config.Drop drops
// packets and streams to chosen addresses, for tests that partition a mesh.
//
// # Staleness
//
// A peer whose last record is older than StaleAfter is Stale. Under FailClosed (default) it is
// not a Candidate; under FailOpen it stays one at its last known load. The policy in force is
// the gauge kvmesh_gossip_stale_policy{policy}; kvmesh_gossip_stale_peers counts stale peers.
//
// # Security
//
// With Config.Key every packet and stream is AES-GCM encrypted and verified both ways
// (memberlist keyring, GossipVerifyIncoming/Outgoing), so a node without the key can neither
// join nor inject state. No key is accepted only with Insecure.
//
// docs/design/gossip.md describes the records and the prefix knowledge they carry.
//
// # Layout
//
// gossip.go is the lifecycle (New, Start, Close, Leave); publish.go publishes this node's
// record; members.go and claims.go are the view of the mesh (liveness, staleness, claims);
// domains.go the model domains; prefixes.go the prefix rounds, which package gossip/round plans
// within the byte budget, without memberlist; receive.go and pushpull.go take what arrives;
// memberlist.go adapts memberlist's delegates with private types; wire.go and state.go are
// the encodings.
//
// # Concurrency and zero value
//
// All methods of Gossip are safe for concurrent use. The zero Gossip is not usable: call New,
// then Start; Close and Leave are safe to call twice, and Members and Index remain readable
// after Close.
package gossip
