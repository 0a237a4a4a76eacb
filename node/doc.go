// Package node is kvmesh's composition root: one Node wires the HTTP API (node/api), the
// request's journey (node/journey's executor: running requests on the local engine, QUIC
// forwarding, pairs, migration), its view of the mesh (node/meshview), the gossip member,
// routing, admission, GPU telemetry and the carbon signal.
//
// Only cmd/kvmesh, testnet and tests import it: it depends on nearly every other package.
//
// # Lifetime
//
// New fills a Config's zero fields with their defaults, validates it and builds the parts
// without I/O. Start reads an external engine's model list (it fails when the engine answers
// without a configured model; an engine that does not answer leaves the node unready until it
// does), binds the listeners and joins the mesh; Shutdown turns the node unready and serves on
// for the drain delay, so load balancers and peers can stop sending it work, then stops taking
// new requests, drains in-flight ones within a deadline, leaves the mesh and closes everything.
// A Node is safe for concurrent use; Shutdown is safe to call twice. The zero Node is not
// usable: build one with New.
//
// # Configuration
//
// Config (package node/nodeconfig) holds every setting of a node and its parts, under one zero
// rule: a zero field means its default. nodeconfig reads the config file (one JSON object or
// the same in YAML, a section per part) over a Config and writes one back, and says which
// settings a reload applies. Reload (reload.go) reads the file again while the node runs: it
// applies admission, routing and the carbon threshold live, through the parts' SetConfig,
// logs each other changed setting as needing a restart, and keeps the settings in force when
// the file is bad. Start watches the file and the API key file for changes
// (Config.ConfigWatch).
//
// # The request's journey
//
// Which attempt comes next is decided by the pure planner of package node/attempt; package
// node/journey's Executor performs the steps: its dispatch performs attempt.Whole's for one
// decision (run on this node, forward to a peer, run a pair), its dispatchPair those of
// attempt.Prefill and attempt.Decode for a split request, and its Migrate asks attempt.Move;
// each attempt's result (answered, refused, failed with a code, broke mid-response, paused,
// client gone, budget spent) goes back to the planner. The node hands the executor its parts
// (journey.Deps) and serves it what stays the node's (journey.Host: decoding, the view of the
// mesh, the waiting room, the agent window, adapters, the console). The first-token bound on
// a generation is package node/firsttoken's.
//
// # Migration
//
// The ingress relays an owner's stream to the client event by event (relay.Stream, the
// executor's Relay) and keeps what it sent; when the owner fails mid-response the request
// moves on as a continuation of that text (the executor's Migrate), through admission and
// routing again, up to
// Config.Migrations times, spliced into the client's stream. An engine that fails mid-stream
// under a live node moves the request the same way: this node's engine through the planner
// (runLocal, or decodeStep for a split request's decode half, attempt.Broke), an owner's by
// the owner ending its stream with the failure (reportBroken), which the ingress's relay takes
// as the owner's.
//
// # Tracing
//
// With Config.OTLPEndpoint (or a Config.TracerProvider) a node traces each generation request
// with OpenTelemetry (package node/tracing's spans): the ingress's server span with its
// admission decision and route, its waits in the waiting room, a client span per forward
// attempt, the owner's server span continuing the trace from the forward's transport header,
// and the engine run with an external engine's HTTP call under it. The W3C trace context comes from the client's
// traceparent; with tracing off the tracer is a no-op that passes a client's trace context on
// unchanged and invents none. Start builds the OTLP pipeline (package node/tracing) and
// Shutdown flushes it.
//
// # Parts in packages of their own
//
// Besides the planner, the executor (node/journey), relay and first-token bound: the node's
// metric families (node/metrics), its view of the mesh (node/meshview), the OpenAI rendering of an engine's output
// (node/render), Responses API ids (node/responseid), the agent window's gate (node/agentgate),
// kvmesh engine's KV connector flow (node/kvconnector), the grid carbon signal (node/grid) and the
// API certificate (node/apicert). The node wires them; each package's doc states its contract.
//
// # Metrics
//
// The node registers its own families and its parts' on Config.Registry (or a new registry),
// served on /metrics. testdata/metrics.golden lists every family a node exports and
// docs/operating.md documents each; TestMetricsGolden keeps both in step with the code.
package node
