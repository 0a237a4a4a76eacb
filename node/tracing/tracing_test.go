package tracing

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// TestSpansAreExportedOnShutdown: a span ended before Shutdown reaches the collector over
// OTLP/HTTP at the traces path, with the node's service name and instance, by host:port and
// by URL.
func TestSpansAreExportedOnShutdown(t *testing.T) {
	var mu sync.Mutex
	var paths []string
	var bodies [][]byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		paths, bodies = append(paths, r.Method+" "+r.URL.Path+" "+r.Header.Get("Content-Type")), append(bodies, b)
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	for _, tt := range []struct{ endpoint, path string }{
		{strings.TrimPrefix(srv.URL, "http://"), DefaultPath},
		{srv.URL, DefaultPath},
		{srv.URL + "/otlp/v1/traces", "/otlp/v1/traces"},
	} {
		t.Run(tt.endpoint, func(t *testing.T) {
			mu.Lock()
			paths, bodies = nil, nil
			mu.Unlock()
			tp, err := New(Config{Endpoint: tt.endpoint, SampleRatio: 1, Instance: "gpu-7", Version: "v9"})
			if err != nil {
				t.Fatal(err)
			}
			_, span := tp.Tracer("test").Start(context.Background(), "kvmesh.request")
			span.End()
			if err := tp.Shutdown(context.Background()); err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if want := "POST " + tt.path + " application/x-protobuf"; len(paths) != 1 || paths[0] != want {
				t.Fatalf("collector got %q, want one %q", paths, want)
			}
			for _, s := range []string{"kvmesh.request", ServiceName, "gpu-7", "v9"} {
				if !bytes.Contains(bodies[0], []byte(s)) {
					t.Errorf("export lacks %q", s)
				}
			}
		})
	}
}

// TestSamplerFollowsTheParent: at ratio 0 a new trace is not sampled, but a request whose
// client sampled its trace is.
func TestSamplerFollowsTheParent(t *testing.T) {
	tp, err := New(Config{Endpoint: "127.0.0.1:1", SampleRatio: 0})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	_, root := tp.Tracer("test").Start(context.Background(), "root")
	if root.SpanContext().IsSampled() {
		t.Error("a new trace was sampled at ratio 0")
	}
	h := propagation.MapCarrier{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	ctx := Propagator.Extract(context.Background(), h)
	_, child := tp.Tracer("test").Start(ctx, "child", trace.WithSpanKind(trace.SpanKindServer))
	if !child.SpanContext().IsSampled() || child.SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("child of a sampled client span: %v sampled %v", child.SpanContext().TraceID(), child.SpanContext().IsSampled())
	}
}

func TestNewRejects(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  Config
	}{
		{"no endpoint", Config{SampleRatio: 1}},
		{"no port", Config{Endpoint: "collector", SampleRatio: 1}},
		{"other scheme", Config{Endpoint: "grpc://collector:4317", SampleRatio: 1}},
		{"no host", Config{Endpoint: "http:///v1/traces", SampleRatio: 1}},
		{"ratio above 1", Config{Endpoint: "collector:4318", SampleRatio: 1.5}},
		{"negative ratio", Config{Endpoint: "collector:4318", SampleRatio: -0.1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tp, err := New(tt.cfg); err == nil {
				_ = tp.Shutdown(context.Background())
				t.Errorf("New(%+v) = nil error", tt.cfg)
			} else if !strings.HasPrefix(err.Error(), "tracing: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
		})
	}
}
