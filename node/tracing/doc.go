// Package tracing builds the OpenTelemetry tracer provider of a kvmesh node: spans batched and
// exported over OTLP/HTTP (protobuf) to a collector, Jaeger or Tempo, with a parent-based ratio
// sampler and the resource service.name=kvmesh, service.instance.id=the node's name.
//
// It only sets the pipeline up; the spans themselves are the node's. The trace context
// travels in the W3C traceparent and tracestate headers (Propagator).
//
// # Concurrency
//
// New is safe to call concurrently; the provider it returns is safe for concurrent use, and
// its Shutdown flushes the spans not yet exported.
package tracing
