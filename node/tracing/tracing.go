package tracing

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Propagator reads and writes the W3C traceparent and tracestate headers.
var Propagator = propagation.TraceContext{}

// ServiceName is the resource's service.name.
const ServiceName = "kvmesh"

// DefaultPath is the OTLP/HTTP traces path, used when the endpoint names none.
const DefaultPath = "/v1/traces"

// Config says where spans go and how many.
type Config struct {
	// Endpoint is the collector: host:port (plain HTTP, path DefaultPath) or an http:// or
	// https:// URL (DefaultPath when it has no path). Required.
	Endpoint string
	// SampleRatio is the share of new traces sampled, in [0, 1]; a request that carries a
	// trace context follows its parent's decision.
	SampleRatio float64
	// Instance is service.instance.id (the node's name) and Version service.version.
	Instance string
	Version  string
}

// New builds a tracer provider exporting to cfg.Endpoint. It does no I/O, but starts the
// batch processor's goroutine: the caller must Shutdown the provider, which flushes it.
// OTEL_EXPORTER_OTLP_HEADERS and the exporter's other OTEL_* variables still apply (a
// collector's credentials belong there, not in a flag).
func New(cfg Config) (*sdktrace.TracerProvider, error) {
	if math.IsNaN(cfg.SampleRatio) || cfg.SampleRatio < 0 || cfg.SampleRatio > 1 {
		return nil, fmt.Errorf("tracing: sample ratio %v is outside [0, 1]", cfg.SampleRatio)
	}
	opts, err := endpointOptions(cfg.Endpoint)
	if err != nil {
		return nil, err
	}
	exp, err := otlptracehttp.New(context.Background(), opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		attribute.String("service.name", ServiceName),
		attribute.String("service.instance.id", cfg.Instance),
		attribute.String("service.version", cfg.Version),
	))
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	return sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SampleRatio))),
	), nil
}

// CheckEndpoint reports whether New would take endpoint.
func CheckEndpoint(endpoint string) error {
	_, err := endpointOptions(endpoint)
	return err
}

// endpointOptions turns host:port or a URL into the exporter's endpoint options.
func endpointOptions(endpoint string) ([]otlptracehttp.Option, error) {
	if endpoint == "" {
		return nil, errors.New("tracing: no OTLP endpoint")
	}
	if !strings.Contains(endpoint, "://") {
		if _, _, err := net.SplitHostPort(endpoint); err != nil {
			return nil, fmt.Errorf("tracing: OTLP endpoint %q: want host:port or a URL: %w", endpoint, err)
		}
		return []otlptracehttp.Option{otlptracehttp.WithEndpoint(endpoint), otlptracehttp.WithURLPath(DefaultPath),
			otlptracehttp.WithInsecure()}, nil
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP endpoint: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("tracing: OTLP endpoint %q: want an http:// or https:// URL with a host", endpoint)
	}
	path := u.Path
	if path == "" || path == "/" {
		path = DefaultPath
	}
	opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(u.Host), otlptracehttp.WithURLPath(path)}
	if u.Scheme == "http" {
		opts = append(opts, otlptracehttp.WithInsecure())
	}
	return opts, nil
}
