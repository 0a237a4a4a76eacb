package node_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kvmesh/kvmesh/node"
)

// A request for an adapter the engine does not hold shows its load on demand as a
// kvmesh.adapter.load span under its request span: the adapter, the node, the engine's API and
// the outcome; a load that first unloaded the least recently used adapter names it, with an
// unload event; a request for a held adapter has no such span.
func TestAdapterLoadIsASpanOfItsRequest(t *testing.T) {
	src := adapterSource(t, model, "a", "b")
	url, exp := tracedNode(t, func(cfg *node.Config) {
		cfg.AdapterSource = src
		cfg.Sim.MaxLoRAs = 1
	})
	for _, a := range []string{"a", "b", "b"} {
		runAdapter(t, url, a)
	}
	reqs := named(t, exp, "kvmesh.request", 3)
	loads := named(t, exp, "kvmesh.adapter.load", 2)
	if len(loads) != 2 {
		t.Fatalf("%d adapter load spans, want 2 (b held at its second request)", len(loads))
	}
	for i, want := range []string{"a", "b"} {
		l := loads[i]
		hasAttrs(t, l, attribute.String("kvmesh.adapter", want), attribute.String("kvmesh.node", "n1"),
			attribute.String("kvmesh.adapter.api", "embedded"), attribute.String("kvmesh.adapter.outcome", "loaded"))
		if !slices.ContainsFunc(reqs, func(r tracetest.SpanStub) bool {
			return r.SpanContext.SpanID() == l.Parent.SpanID() && r.SpanContext.TraceID() == l.SpanContext.TraceID()
		}) {
			t.Errorf("the load of %s is not a child of a request span", want)
		}
		if l.Status.Code == codes.Error || !l.EndTime.After(l.StartTime) {
			t.Errorf("the load of %s: status %v, %v to %v", want, l.Status, l.StartTime, l.EndTime)
		}
	}
	hasAttrs(t, loads[1], attribute.String("kvmesh.adapter.evicted", "a"))
	if ev := loads[1].Events; len(ev) != 1 || ev[0].Name != "kvmesh.adapter.unload" ||
		!slices.Contains(ev[0].Attributes, attribute.String("kvmesh.adapter", "a")) {
		t.Errorf("b's load events %v, want a's unload", ev)
	}
	if slices.ContainsFunc(loads[0].Attributes, func(kv attribute.KeyValue) bool { return kv.Key == "kvmesh.adapter.evicted" }) {
		t.Errorf("a's load names an eviction: %v", loads[0].Attributes)
	}
}

// A load the engine refuses is a failed kvmesh.adapter.load span: error status with the
// client's code, the engine's reason recorded as the error, the engine's runtime API named.
func TestFailedAdapterLoadIsASpanError(t *testing.T) {
	const base = "base-model"
	vllm, _ := failingVLLM(t, base)
	src := adapterSource(t, base, "broken")
	url, exp := tracedNode(t, func(cfg *node.Config) {
		cfg.AdapterSource = src
		cfg.Engine, cfg.Models = vllm, nil
	})
	resp := post(t, url, "/v1/chat/completions", chatFor("broken", "hello"), nil)
	if body := readAll(t, resp); resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	l := named(t, exp, "kvmesh.adapter.load", 1)[0]
	hasAttrs(t, l, attribute.String("kvmesh.adapter", "broken"), attribute.String("kvmesh.adapter.outcome", "failed"),
		attribute.String("kvmesh.adapter.api", "POST /v1/load_lora_adapter"), attribute.String("error.type", node.CodeAdapterLoadFailed))
	if l.Status.Code != codes.Error || l.Status.Description != node.CodeAdapterLoadFailed {
		t.Errorf("status %v, want an error with %s", l.Status, node.CodeAdapterLoadFailed)
	}
	if !slices.ContainsFunc(l.Events, func(e sdktrace.Event) bool {
		return e.Name == "exception" && slices.ContainsFunc(e.Attributes, func(kv attribute.KeyValue) bool {
			return kv.Key == "exception.message" && strings.Contains(kv.Value.AsString(), "No adapter found")
		})
	}) {
		t.Errorf("events %v, want the engine's reason recorded as the error", l.Events)
	}
}
