// Package metrics holds a node's own Prometheus families: the request counters and latency
// histograms (Metrics), their bounded label values, and the collectors that read the agent
// window (AgentCollector) and the node's libraries (StateCollector) at scrape time.
//
// # Contract
//
//   - New registers every family on the registerer it is given (nil: none) with its label
//     values at zero, so a rate is right from a node's first request. Every request that
//     reaches a handler is counted once in Received and once in exactly one of Completed,
//     Refused or Failed.
//   - Label values are this package's constants or admit's and route's bounded ones; no
//     label takes a value from a request.
//   - Metrics' fields are safe for concurrent use (Prometheus's collectors are); the
//     collectors read their sources at each scrape, concurrently with the node.
package metrics
