// Package round plans gossip's prefix rounds and keeps their byte budget: which members of a
// node's prefix domains are sent its record, its coalesced prefix deltas and its whole
// residency, within the bytes a second the node may send. It holds no sockets, no memberlist
// and no clock: time and every member's state are passed in, and a plan is returned for the
// caller (package gossip) to send.
//
// # Rules
//
//   - Recipients are the union of the domains' members, each once, sorted by name.
//   - The budget is a token bucket (Bucket) of Rate bytes a second holding one second's worth;
//     state records and prefix rounds spend from the same bucket.
//   - A record goes straight to a synced member last sent one RecordEvery ago or more, at most
//     half the budget a round (never less than one record), going round the members from
//     where the last round stopped; it goes whatever the bucket's debt.
//   - A round's deltas go to every member while the bucket is not in debt and they cost at
//     most two seconds of budget (MaxRound), overdrawing the bucket if need be; past that they
//     are dropped and every member is sent the residency again; in debt they wait.
//   - The residency goes, in order, to the members not synced, each while the bucket is not
//     in debt; one larger than MaxRound goes to none, which count as synced (the push/pull
//     snapshot brings them up to date).
//
// # Concurrency
//
// The functions are pure. A Bucket is a value; its methods are not safe for concurrent use.
package round
