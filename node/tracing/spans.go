package tracing

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/cespare/xxhash/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/transport"
)

// A request's spans across the mesh (docs/operating.md#tracing). The ingress's server span
// holds the admission decision and the route; a queue span its wait in the waiting room; a
// client span each forward attempt, whose context travels to the owner in the transport
// header; the owner's server span continues that trace, and an engine span covers the run,
// with an external engine's HTTP call as its child. With tracing off every tracer is a no-op
// that carries a client's own traceparent on unchanged and invents none.

// Span names.
const (
	spanRequest = "kvmesh.request"
	spanQueue   = "kvmesh.queue"
	spanForward = "kvmesh.forward"
	spanOwner   = "kvmesh.owner"
	spanEngine  = "kvmesh.engine"
)

// Attribute keys.
const (
	attrRequestID     = attribute.Key("kvmesh.request_id")
	attrEndpoint      = attribute.Key("kvmesh.endpoint")
	attrPriority      = attribute.Key("kvmesh.priority")
	attrTenant        = attribute.Key("kvmesh.tenant") // a hash of the tenant's name
	attrIngress       = attribute.Key("kvmesh.ingress")
	attrDecision      = attribute.Key("kvmesh.decision") // accept, queue, refuse
	attrDecisionCode  = attribute.Key("kvmesh.decision.code")
	attrDecisionLayer = attribute.Key("kvmesh.decision.layer")
	attrPeer          = attribute.Key("kvmesh.peer")
	attrRouteScore    = attribute.Key("kvmesh.route.score")
	attrRoutePrefix   = attribute.Key("kvmesh.route.prefix_tokens")
	attrRouteLoad     = attribute.Key("kvmesh.route.load")
	attrRouteTTFT     = attribute.Key("kvmesh.route.predicted_ttft_seconds")
	attrForwardResult = attribute.Key("kvmesh.forward.result")
	attrOutcome       = attribute.Key("kvmesh.outcome") // completed, refused, failed
	attrErrorType     = attribute.Key("error.type")
	attrEngineTTFT    = attribute.Key("kvmesh.engine.ttft_seconds")
	attrModel         = attribute.Key("gen_ai.request.model")
	attrMaxTokens     = attribute.Key("gen_ai.request.max_tokens")
	attrInputTokens   = attribute.Key("gen_ai.usage.input_tokens")
	attrOutputTokens  = attribute.Key("gen_ai.usage.output_tokens")
	attrFinishReasons = attribute.Key("gen_ai.response.finish_reasons")
	attrHTTPMethod    = attribute.Key("http.request.method")
	attrHTTPRoute     = attribute.Key("http.route")
)

// TracerName is the instrumentation scope of a node's spans.
const TracerName = "github.com/kvmesh/kvmesh/node"

// Spans starts the spans of a request's journey on one tracer. The zero value is not usable;
// NewSpans builds one.
type Spans struct{ tracer trace.Tracer }

// NewSpans returns the Spans of tp's tracer for a node of version; a nil tp is a no-op one.
func NewSpans(tp trace.TracerProvider, version string) Spans {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return Spans{tracer: tp.Tracer(TracerName, trace.WithInstrumentationVersion(version))}
}

// Request starts the ingress's server span of a client request, continuing the client's trace
// when it sent a traceparent.
func (s Spans) Request(r *http.Request, endpoint, id string) (context.Context, trace.Span) {
	ctx := Propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := s.tracer.Start(ctx, spanRequest, trace.WithSpanKind(trace.SpanKindServer))
	if span.IsRecording() { // attributes cost nothing with tracing off
		span.SetAttributes(attrRequestID.String(id), attrEndpoint.String(endpoint),
			attrHTTPMethod.String(r.Method), attrHTTPRoute.String(r.URL.Path))
	}
	return ctx, span
}

// Queue starts the span of a request's wait in the waiting room, queued with code.
func (s Spans) Queue(ctx context.Context, code string) (context.Context, trace.Span) {
	ctx, span := s.tracer.Start(ctx, spanQueue)
	if span.IsRecording() {
		span.SetAttributes(attrDecisionCode.String(code))
	}
	return ctx, span
}

// Forward starts the client span of one forward attempt to peer and puts its context in h,
// for the owner to continue.
func (s Spans) Forward(ctx context.Context, peer string, h *transport.Header) (context.Context, trace.Span) {
	ctx, span := s.tracer.Start(ctx, spanForward, trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		span.SetAttributes(attrPeer.String(peer))
	}
	Propagator.Inject(ctx, transportCarrier{h})
	return ctx, span
}

// Owner starts the owner's server span of a forwarded generation, continuing the ingress's
// trace; other streams (agent leases, the simple endpoints) get none.
func (s Spans) Owner(ctx context.Context, h transport.Header) (context.Context, trace.Span) {
	if h.Kind != transport.KindRequest || (h.Endpoint != transport.EndpointChat && h.Endpoint != transport.EndpointCompletions) {
		return ctx, trace.SpanFromContext(ctx)
	}
	ctx = Propagator.Extract(ctx, transportCarrier{&h})
	ctx, span := s.tracer.Start(ctx, spanOwner, trace.WithSpanKind(trace.SpanKindServer))
	if span.IsRecording() {
		span.SetAttributes(attrRequestID.String(h.RequestID), attrIngress.String(h.Ingress), attrEndpoint.String(h.Endpoint.String()),
			attrPriority.Int(h.Priority), attrTenant.String(TenantHash(h.Tenant)))
	}
	return ctx, span
}

// Engine runs req on eng inside an engine span, which ends with the stream; code names an
// error of Generate on the span.
func (s Spans) Engine(ctx context.Context, eng engine.Engine, req *engine.Request, code func(error) string) (engine.Stream, error) {
	ctx, span := s.tracer.Start(ctx, spanEngine)
	if !span.IsRecording() {
		span.End() // a no-op span, or one not sampled
		return eng.Generate(ctx, req)
	}
	span.SetAttributes(attrModel.String(req.Model), attrMaxTokens.Int(req.MaxTokens), attrRequestID.String(req.ID))
	st, err := eng.Generate(ctx, req)
	if err != nil {
		Error(span, code(err))
		span.End()
		return nil, err
	}
	return &tracedStream{Stream: st, span: span, start: time.Now()}, nil
}

// End records how a request ended on its server span; any end but completion is an error
// status carrying its code.
func End(span trace.Span, completed, refused bool, code string) {
	if !span.IsRecording() {
		return
	}
	switch {
	case completed:
		span.SetAttributes(attrOutcome.String("completed"))
		return
	case refused:
		span.SetAttributes(attrOutcome.String("refused"))
	default:
		span.SetAttributes(attrOutcome.String("failed"))
	}
	Error(span, code)
}

// Error marks span failed with code.
func Error(span trace.Span, code string) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attrErrorType.String(code))
	span.SetStatus(codes.Error, code)
}

// TenantHash names a tenant in spans without its name: the first 8 bytes of its xxhash, hex.
func TenantHash(tenant string) string {
	return fmt.Sprintf("%016x", xxhash.Sum64String(tenant))
}

// Decision records an admission decision (its action, layer and code, "" for none) on span.
func Decision(span trace.Span, action, layer, code string) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attrDecision.String(action), attrDecisionLayer.String(layer))
	if code != "" {
		span.SetAttributes(attrDecisionCode.String(code))
	}
}

// RequestAttrs records what a request asks for on span: its model, priority and tenant (hashed).
func RequestAttrs(span trace.Span, model string, priority int, tenant string) {
	if span.IsRecording() {
		span.SetAttributes(attrModel.String(model), attrPriority.Int(priority), attrTenant.String(TenantHash(tenant)))
	}
}

// Model records a request's model on span.
func Model(span trace.Span, model string) {
	if span.IsRecording() {
		span.SetAttributes(attrModel.String(model))
	}
}

// Peer records the node chosen to run a request on span.
func Peer(span trace.Span, peer string) {
	if span.IsRecording() {
		span.SetAttributes(attrPeer.String(peer))
	}
}

// Route records the candidate an ingress chose on span: the peer, its score, the prefix it
// holds in tokens, its load and its predicted time to first token.
func Route(span trace.Span, peer string, score float64, prefixTokens int, load float64, ttft time.Duration) {
	if span.IsRecording() {
		span.SetAttributes(attrPeer.String(peer), attrRouteScore.Float64(score), attrRoutePrefix.Int(prefixTokens),
			attrRouteLoad.Float64(load), attrRouteTTFT.Float64(ttft.Seconds()))
	}
}

// ForwardResult records how a forward attempt ended (the forwards metric's result label) and,
// for a refusal or a failure, the owner's code, else the result.
func ForwardResult(span trace.Span, result, code string) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attrForwardResult.String(result))
	if result == "accepted" {
		return
	}
	if code == "" {
		code = result
	}
	Error(span, code)
}

// tracedStream records a generation's first token, finish reason and usage on its span.
type tracedStream struct {
	engine.Stream
	span  trace.Span
	start time.Time
	first bool
}

func (s *tracedStream) Recv() (engine.Chunk, error) {
	c, err := s.Stream.Recv()
	switch {
	case err == io.EOF:
	case err != nil:
		Error(s.span, "engine_error")
	default:
		if !s.first {
			s.first = true
			s.span.SetAttributes(attrEngineTTFT.Float64(time.Since(s.start).Seconds()))
			s.span.AddEvent("first_token")
		}
		if c.FinishReason != "" {
			s.span.SetAttributes(attrFinishReasons.StringSlice([]string{c.FinishReason}))
		}
		if u := c.Usage; u != nil {
			s.span.SetAttributes(attrInputTokens.Int(u.PromptTokens), attrOutputTokens.Int(u.CompletionTokens))
		}
	}
	return c, err
}

func (s *tracedStream) Close() error {
	err := s.Stream.Close()
	s.span.End()
	return err
}

// transportCarrier is a forward's header as a propagation.TextMapCarrier: the W3C trace
// context's two keys.
type transportCarrier struct{ h *transport.Header }

func (c transportCarrier) Get(key string) string {
	switch key {
	case "traceparent":
		return c.h.TraceParent
	case "tracestate":
		return c.h.TraceState
	}
	return ""
}

func (c transportCarrier) Set(key, v string) {
	switch key {
	case "traceparent":
		c.h.TraceParent = v
	case "tracestate":
		c.h.TraceState = v
	}
}

func (c transportCarrier) Keys() []string { return []string{"traceparent", "tracestate"} }
