// Package agentgate is a node's side of agent-level admission: the node is the home of every
// agent whose steps run on its engine, so it keeps their window (an agent.Home over an
// agent.Registry), feeds it the engine's state each control interval (Tick), parks the local
// steps of agents outside the window and wakes them when the window lets them in, and holds a
// peer ingress's renewal of a parked step until its agent is let in or the wait ends (Renew).
//
// It does not pin prefixes: the window is sized so that the active agents' prefixes stay in an
// LRU cache on their own, and if they do not, the falling hit rate is the signal to cut. It
// sends nothing over the mesh: the lease messages and the request's journey are the node's.
//
// A step is named by a comparable value the caller chooses (the node passes its request's
// pointer), an agent by its scoped id.
//
// # Concurrency
//
// A Gate is safe for concurrent use. Its zero value is not usable; New builds one.
package agentgate
