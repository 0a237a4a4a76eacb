// Package console is the mesh console: one page, embedded in the binary, that a node serves
// at /console, and the JSON it polls once a second.
//
// The page shows this node's view of the whole mesh (the /v1/mesh/peers body), the node's
// admission, SLO, forward, migration, ejection and carbon counters (read from its Prometheus
// registry, never counted twice), the forwards this node sent to and received from each peer
// (Flows), and the explanation of each of the last requests it decided (Ring). The page turns
// counters into rates itself, from consecutive polls.
//
// # Cost
//
// The state a poll returns is built at most once per Config.Interval, whatever the number of
// open consoles: a poll within the interval gets the bytes of the last one. Its size grows
// with the mesh (one row a peer); everything else is bounded (Ring's size, Flows' MaxPeers).
//
// # Concurrency
//
// A Console is safe for concurrent use: the request path calls Record, ForwardSent and
// ForwardReceived while handlers read. The zero value is not usable; call New.
package console
