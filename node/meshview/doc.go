// Package meshview is a node's picture of the mesh as routing and the API read it: the one
// mapping of a member's gossip record to the route.Peer routing scores (PeerOf), a routing
// decision's View of this node and the peers serving a model, the KV claims the waiting
// rooms' blocked heads hold, the models the mesh serves, and GET /v1/mesh/peers' body.
//
// # Contract
//
//   - PeerOf is the only place a field of gossip.State becomes a signal routing reads; its
//     test fails for a field of the record that is neither mapped nor named as read elsewhere.
//   - A View belongs to one request at a time (it is scratch reused between decisions); Mesh
//     is a set of shared, concurrency-safe parts and is safe for concurrent use. A Mesh with
//     no Gossip (a standalone node) sees this node alone.
//   - Nothing here starts a goroutine or does I/O; time is passed in where it matters.
package meshview
