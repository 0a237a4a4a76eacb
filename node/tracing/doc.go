// Package tracing builds the OpenTelemetry tracer provider of a kvmesh node: spans batched and
// exported over OTLP/HTTP (protobuf) to a collector, Jaeger or Tempo, with a parent-based ratio
// sampler and the resource service.name=kvmesh, service.instance.id=the node's name.
//
// Spans starts the spans of a request's journey: the ingress's server span, the queue wait,
// each forward attempt, the owner's server span and the engine run, and, recorded once it is
// over, a LoRA adapter's load on demand (AdapterLoad); End, Decision, Route, Peer and
// ForwardResult record on them. The trace context travels in the W3C traceparent and
// tracestate headers (Propagator), between nodes in the forward header.
//
// # Concurrency
//
// New is safe to call concurrently; the provider it returns is safe for concurrent use, and
// its Shutdown flushes the spans not yet exported. Spans is safe for concurrent use; the
// stream Spans.Engine returns is used by one goroutine at a time, as any engine.Stream.
package tracing
