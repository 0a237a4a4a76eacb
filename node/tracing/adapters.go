package tracing

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// The span of a LoRA adapter's load on demand: a child of the span of the request whose run
// needed it (the ingress's, or the owner's), from the request's acquire of the adapter to its
// end, recorded once the acquire returns. A request for an adapter the engine held has none.

const spanAdapterLoad = "kvmesh.adapter.load"

// eventAdapterUnload is the event of an unload that made room for the load.
const eventAdapterUnload = "kvmesh.adapter.unload"

const (
	attrAdapter        = attribute.Key("kvmesh.adapter")
	attrNode           = attribute.Key("kvmesh.node")
	attrAdapterAPI     = attribute.Key("kvmesh.adapter.api")
	attrAdapterOutcome = attribute.Key("kvmesh.adapter.outcome")
	attrAdapterEvicted = attribute.Key("kvmesh.adapter.evicted")
	attrAdapterLoad    = attribute.Key("kvmesh.adapter.load_seconds")
	attrAdapterWait    = attribute.Key("kvmesh.adapter.wait_seconds")
	attrAdapterUnload  = attribute.Key("kvmesh.adapter.unload_seconds")
)

// AdapterLoad is what one request's acquire of its LoRA adapter did.
type AdapterLoad struct {
	Adapter string // the adapter (the request's model)
	Node    string // the node whose engine loads it
	API     string // the engine's runtime API: "POST /v1/load_lora_adapter", ..., "embedded"
	// Outcome: loaded (this request ran the load), waited (another request's load served
	// it), or the failure's (failed, timeout, slots_busy, not_in_source, cancelled).
	Outcome    string
	Start, End time.Time
	Load, Wait time.Duration // the load this request ran (its unload included); its waits for others'
	Unloads    []AdapterUnload
	Err        error  // the acquire's failure
	Code       string // its code in the client's answer
}

// AdapterUnload is the unload of the least recently used adapter that made room.
type AdapterUnload struct {
	Adapter string
	At      time.Time // when it ended
	Took    time.Duration
	Err     error
}

// AdapterLoad records l as a child span of ctx's span; a failure is the span's error status
// (l.Code) with the error recorded as an exception event.
func (s Spans) AdapterLoad(ctx context.Context, l *AdapterLoad) {
	_, span := s.tracer.Start(ctx, spanAdapterLoad, trace.WithTimestamp(l.Start))
	if !span.IsRecording() {
		span.End()
		return
	}
	span.SetAttributes(attrAdapter.String(l.Adapter), attrNode.String(l.Node), attrAdapterAPI.String(l.API),
		attrAdapterOutcome.String(l.Outcome))
	if l.Load > 0 {
		span.SetAttributes(attrAdapterLoad.Float64(l.Load.Seconds()))
	}
	if l.Wait > 0 {
		span.SetAttributes(attrAdapterWait.Float64(l.Wait.Seconds()))
	}
	for _, u := range l.Unloads {
		attrs := []attribute.KeyValue{attrAdapter.String(u.Adapter), attrAdapterUnload.Float64(u.Took.Seconds())}
		if u.Err != nil {
			attrs = append(attrs, attribute.String("exception.message", u.Err.Error()))
		} else {
			span.SetAttributes(attrAdapterEvicted.String(u.Adapter)) // one a load at most
		}
		span.AddEvent(eventAdapterUnload, trace.WithTimestamp(u.At), trace.WithAttributes(attrs...))
	}
	if l.Err != nil {
		span.RecordError(l.Err, trace.WithTimestamp(l.End))
		Error(span, l.Code)
	}
	span.End(trace.WithTimestamp(l.End))
}
