package node_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet"
)

// A client's trace context: trace 4bf9..., its span 00f0..., sampled.
const (
	clientTrace      = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpan       = "00f067aa0ba902b7"
	clientParent     = "00-" + clientTrace + "-" + clientSpan + "-01"
	clientTraceState = "congo=t61rcWkgMzE"
)

// startEngineMesh starts two nodes: n1 in front of the external engine f, n2 an ingress that
// must forward to n1 (it serves another model). configure, when not nil, adds to each node's
// config. It returns once n2 sees n1's engine healthy.
func startEngineMesh(t *testing.T, f *recordingEngine, configure func(i int, cfg *node.Config)) *testnet.Net {
	t.Helper()
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		if configure != nil {
			configure(i, cfg)
		}
		if i == 0 {
			cfg.Engine, cfg.EngineKind = f.url, "vllm"
			return
		}
		cfg.Models = []string{"another-model"}
		cfg.Route.Delegate = new(bool) // the ingress's own forward is traced here, not a delegate's
	})
	poll.Until(t, 10*time.Second, "n2 to see n1's engine healthy", func() bool {
		for _, m := range tn.Nodes[1].Members() {
			if m.Name == "n1" {
				return m.State.EngineHealthy && len(m.State.Models) > 0
			}
		}
		return false
	})
	return tn
}

// TestTraceFollowsAForwardedRequest: a request with a client's traceparent, sent to an ingress
// that forwards it, yields spans on both nodes in the client's trace: the ingress's server
// span a child of the client's span, its forward span's child the owner's server span, then
// the engine run and the HTTP call to the external engine, whose traceparent names that call.
func TestTraceFollowsAForwardedRequest(t *testing.T) {
	f := startRecordingEngine(t)
	exps := []*tracetest.InMemoryExporter{tracetest.NewInMemoryExporter(), tracetest.NewInMemoryExporter()}
	tn := startEngineMesh(t, f, func(i int, cfg *node.Config) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exps[i]))
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		cfg.TracerProvider = tp
	})
	resp := post(t, tn.URLs()[1], "/v1/chat/completions", chatBody("trace me", 4, true),
		map[string]string{"traceparent": clientParent, "tracestate": clientTraceState})
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK || resp.Header.Get(node.HeaderNode) != "n1" {
		t.Fatalf("status %d node %q: %s", resp.StatusCode, resp.Header.Get(node.HeaderNode), body)
	}
	got := <-f.traces

	// Server spans end once their handlers return, which may be after the client has read
	// the whole response.
	var ingress, owner map[string]tracetest.SpanStub
	poll.Until(t, 10*time.Second, "the spans of both nodes", func() bool {
		ingress, owner = byName(exps[1].GetSpans()), byName(exps[0].GetSpans())
		return len(ingress) == 2 && len(owner) == 3
	})
	req, fwd := ingress["kvmesh.request"], ingress["kvmesh.forward"]
	own, run, call := owner["kvmesh.owner"], owner["kvmesh.engine"], owner["POST /v1/chat/completions"]
	for _, s := range []tracetest.SpanStub{req, fwd, own, run, call} {
		if s.SpanContext.TraceID().String() != clientTrace {
			t.Errorf("span %q is in trace %s, want the client's %s", s.Name, s.SpanContext.TraceID(), clientTrace)
		}
	}
	for _, c := range []struct {
		child, parent tracetest.SpanStub
		parentID      string
		kind          trace.SpanKind
	}{
		{req, tracetest.SpanStub{Name: "the client's span"}, clientSpan, trace.SpanKindServer},
		{fwd, req, "", trace.SpanKindClient},
		{own, fwd, "", trace.SpanKindServer},
		{run, own, "", trace.SpanKindInternal},
		{call, run, "", trace.SpanKindClient},
	} {
		want := c.parentID
		if want == "" {
			want = c.parent.SpanContext.SpanID().String()
		}
		if got := c.child.Parent.SpanID().String(); got != want {
			t.Errorf("span %q has parent %s, want %q's %s", c.child.Name, got, c.parent.Name, want)
		}
		if c.child.SpanKind != c.kind {
			t.Errorf("span %q is of kind %v, want %v", c.child.Name, c.child.SpanKind, c.kind)
		}
	}
	if !own.Parent.IsRemote() || own.Parent.TraceState().String() != clientTraceState {
		t.Errorf("the owner's parent %v (remote %v), want the ingress's forward span with the client's trace state",
			own.Parent.SpanID(), own.Parent.IsRemote())
	}
	if want := fmt.Sprintf("00-%s-%s-01", clientTrace, call.SpanContext.SpanID()); got != [2]string{want, clientTraceState} {
		t.Errorf("the engine got traceparent %q tracestate %q, want %q %q", got[0], got[1], want, clientTraceState)
	}
	for _, c := range []struct {
		span tracetest.SpanStub
		want []attribute.KeyValue
	}{
		{req, []attribute.KeyValue{attribute.String("kvmesh.decision", "accept"), attribute.String("kvmesh.peer", "n1"),
			attribute.String("gen_ai.request.model", model), attribute.String("kvmesh.outcome", "completed"),
			attribute.Int("kvmesh.priority", 0)}},
		{fwd, []attribute.KeyValue{attribute.String("kvmesh.peer", "n1"), attribute.String("kvmesh.forward.result", "accepted")}},
		{own, []attribute.KeyValue{attribute.String("kvmesh.ingress", "n2"), attribute.String("kvmesh.decision", "accept"),
			attribute.String("gen_ai.request.model", model), attribute.String("kvmesh.outcome", "completed")}},
		{run, []attribute.KeyValue{attribute.Int("gen_ai.usage.input_tokens", 9), attribute.Int("gen_ai.usage.output_tokens", 1),
			attribute.StringSlice("gen_ai.response.finish_reasons", []string{"stop"})}},
		{call, []attribute.KeyValue{attribute.Int("http.response.status_code", http.StatusOK)}},
	} {
		for _, kv := range c.want {
			if !slices.ContainsFunc(c.span.Attributes, func(a attribute.KeyValue) bool { return a == kv }) {
				t.Errorf("span %q lacks %s=%s; has %v", c.span.Name, kv.Key, kv.Value.Emit(), c.span.Attributes)
			}
		}
		if c.span.Status.Code == codes.Error {
			t.Errorf("span %q has status %v", c.span.Name, c.span.Status)
		}
	}
	if !slices.ContainsFunc(req.Attributes, func(a attribute.KeyValue) bool { return a.Key == "kvmesh.request_id" && a.Value.AsString() != "" }) {
		t.Errorf("the ingress's span lacks the request id: %v", req.Attributes)
	}
}

// TestRefusalIsASpanError: a request refused at the ingress ends its span with an error
// status carrying the refusal's code.
func TestRefusalIsASpanError(t *testing.T) {
	url, exp := tracedNode(t, func(*node.Config) {})
	resp := post(t, url, "/v1/chat/completions", `{"model":"no-such-model","messages":[{"role":"user","content":"hi"}]}`, nil)
	readAll(t, resp)
	code := resp.Header.Get(node.HeaderReason)
	if resp.StatusCode != http.StatusNotFound || code == "" {
		t.Fatalf("status %d reason %q, want a 404 refusal", resp.StatusCode, code)
	}
	s := named(t, exp, "kvmesh.request", 1)[0]
	if s.Status.Code != codes.Error || s.Status.Description != code {
		t.Errorf("span status %v, want an error with %q", s.Status, code)
	}
	hasAttrs(t, s, attribute.String("kvmesh.outcome", "refused"), attribute.String("error.type", code))
}

// TestSimpleEndpointsHaveARequestSpan: a request of a simple endpoint (embeddings, the
// Responses API) gets the ingress's server span chat completions get: in the client's trace,
// with its request id, endpoint, route, model, the node that ran it and how it ended.
func TestSimpleEndpointsHaveARequestSpan(t *testing.T) {
	url, exp := tracedNode(t, func(*node.Config) {})
	for _, c := range []struct {
		path, endpoint, body string
		status               int
		outcome              string
	}{
		{"/v1/embeddings", "embeddings", `{"model":"` + model + `","input":"hello"}`, http.StatusOK, "completed"},
		{"/v1/responses", "responses", `{"model":"` + model + `","input":"hello"}`, http.StatusBadRequest, "refused"},
	} {
		t.Run(c.endpoint, func(t *testing.T) {
			exp.Reset()
			resp := post(t, url, c.path, c.body, map[string]string{"traceparent": clientParent})
			if body := readAll(t, resp); resp.StatusCode != c.status {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			s := named(t, exp, "kvmesh.request", 1)[0]
			if s.SpanContext.TraceID().String() != clientTrace || s.Parent.SpanID().String() != clientSpan || s.SpanKind != trace.SpanKindServer {
				t.Errorf("span in trace %s under %s, kind %v: want the client's trace, under its span, a server span",
					s.SpanContext.TraceID(), s.Parent.SpanID(), s.SpanKind)
			}
			want := []attribute.KeyValue{attribute.String("kvmesh.request_id", resp.Header.Get(node.HeaderRequestID)),
				attribute.String("kvmesh.endpoint", c.endpoint), attribute.String("http.route", c.path),
				attribute.String("http.request.method", http.MethodPost), attribute.String("gen_ai.request.model", model),
				attribute.String("kvmesh.outcome", c.outcome)}
			if c.outcome == "completed" {
				want = append(want, attribute.String("kvmesh.peer", "n1"), attribute.Int("kvmesh.priority", 0))
			} else {
				want = append(want, attribute.String("error.type", resp.Header.Get(node.HeaderReason)))
			}
			hasAttrs(t, s, want...)
		})
	}
}

// TestTracingOffInventsNoTraceparent: with tracing off a client's traceparent and tracestate
// reach the external engine unchanged, whether the client came to the engine's node or to a
// peer that forwarded the request, and a request without one reaches it without one.
func TestTracingOffInventsNoTraceparent(t *testing.T) {
	f := startRecordingEngine(t)
	tn := startEngineMesh(t, f, nil)
	for i, url := range tn.URLs() {
		for _, want := range [][2]string{{clientParent, clientTraceState}, {"", ""}} {
			t.Run(fmt.Sprintf("via n%d with %q", i+1, want[0]), func(t *testing.T) {
				hdr := map[string]string{}
				if want[0] != "" {
					hdr["traceparent"], hdr["tracestate"] = want[0], want[1]
				}
				resp := post(t, url, "/v1/chat/completions", chatBody("no tracing", 4, false), hdr)
				if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d: %s", resp.StatusCode, body)
				}
				if got := <-f.traces; got != want {
					t.Errorf("the engine got traceparent %q tracestate %q, want %q %q", got[0], got[1], want[0], want[1])
				}
			})
		}
	}
}

// TestOTLPExportIsFlushedOnShutdown: with OTLPEndpoint a node exports its spans over
// OTLP/HTTP, and Shutdown flushes those not yet sent.
func TestOTLPExportIsFlushedOnShutdown(t *testing.T) {
	var mu sync.Mutex
	var got []byte
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/v1/traces" {
			mu.Lock()
			got = append(got, b...)
			mu.Unlock()
		}
	}))
	t.Cleanup(collector.Close)
	n, url, err := startStandalone(t, func(cfg *node.Config) { cfg.OTLPEndpoint = strings.TrimPrefix(collector.URL, "http://") })
	if err != nil {
		t.Fatal(err)
	}
	resp := post(t, url, "/v1/chat/completions", chatBody("export me", 2, false), nil)
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if err := n.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, s := range []string{"kvmesh.request", "kvmesh.engine", "service.instance.id", "engine"} {
		if !bytes.Contains(got, []byte(s)) {
			t.Errorf("the collector got no %q", s)
		}
	}
}

// tracedNode starts one node with an in-memory span exporter; configure adds to its config.
func tracedNode(t *testing.T, configure func(cfg *node.Config)) (string, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tn := startNet(t, 1, func(_ int, cfg *node.Config) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		cfg.TracerProvider = tp
		configure(cfg)
	})
	return tn.URLs()[0], exp
}

// named returns the spans called name, once want of them have ended, in the order they ended.
func named(t *testing.T, exp *tracetest.InMemoryExporter, name string, want int) []tracetest.SpanStub {
	t.Helper()
	var out []tracetest.SpanStub
	poll.Until(t, 10*time.Second, "spans "+name, func() bool {
		out = slices.DeleteFunc(exp.GetSpans(), func(s tracetest.SpanStub) bool { return s.Name != name })
		return len(out) >= want
	})
	return out
}

// hasAttrs reports on t the attributes of want that span lacks.
func hasAttrs(t *testing.T, span tracetest.SpanStub, want ...attribute.KeyValue) {
	t.Helper()
	for _, kv := range want {
		if !slices.Contains(span.Attributes, kv) {
			t.Errorf("span %q lacks %s=%s; has %v", span.Name, kv.Key, kv.Value.Emit(), span.Attributes)
		}
	}
}

// byName indexes spans by name (each name once in these tests).
func byName(spans tracetest.SpanStubs) map[string]tracetest.SpanStub {
	m := make(map[string]tracetest.SpanStub, len(spans))
	for _, s := range spans {
		m[s.Name] = s
	}
	return m
}
