package external

import (
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

const tracerName = "github.com/kvmesh/kvmesh/node/engine/external"

// startCall starts the client span of an HTTP call to the server, on the pipeline of the
// span in hreq's context (a no-op one when the node traces nothing), and writes the call's
// W3C trace context into hreq's traceparent and tracestate headers, which vLLM continues when
// it exports traces itself. With tracing off a client's own traceparent passes through
// unchanged, and none is invented.
func startCall(hreq *http.Request) trace.Span {
	ctx := hreq.Context()
	ctx, span := trace.SpanFromContext(ctx).TracerProvider().Tracer(tracerName).Start(ctx,
		hreq.Method+" "+hreq.URL.Path, trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		span.SetAttributes(attribute.String("http.request.method", hreq.Method), attribute.String("server.address", hreq.URL.Host),
			attribute.String("url.path", hreq.URL.Path))
	}
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(hreq.Header))
	return span
}

// callAnswered records the server's status on span: anything but 200 is an error.
func callAnswered(span trace.Span, status int) {
	span.SetAttributes(attribute.Int("http.response.status_code", status))
	if status != http.StatusOK {
		span.SetAttributes(attribute.String("error.type", strconv.Itoa(status)))
		span.SetStatus(codes.Error, http.StatusText(status))
	}
}

// callFailed records a call that got no answer and ends span.
func callFailed(span trace.Span, err error) {
	span.SetAttributes(attribute.String("error.type", "unavailable"))
	span.SetStatus(codes.Error, err.Error())
	span.End()
}
