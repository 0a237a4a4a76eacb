package node

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

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/tracing"
	"github.com/kvmesh/kvmesh/node/transport"
)

// Tracing: one request's spans across the mesh (docs/operating.md#tracing). The ingress's
// server span holds the admission decision and the route; a queue span its wait in the
// waiting room; a client span each forward attempt, whose context travels to the owner in the
// transport header; the owner's server span continues that trace, and an engine span covers
// the run, with an external engine's HTTP call as its child. With tracing off every tracer is
// a no-op that carries a client's own traceparent on unchanged and invents none.

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

const tracerName = "github.com/kvmesh/kvmesh/node"

// buildTracer sets the tracer New's parts use: Config.TracerProvider's, else a no-op one
// until Start builds the OTLP pipeline.
func (n *Node) buildTracer() {
	tp := n.cfg.TracerProvider
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	n.tracer = tp.Tracer(tracerName, trace.WithInstrumentationVersion(Version))
}

// startTracing builds the OTLP pipeline when Config.OTLPEndpoint asks for one and no
// TracerProvider was given. It runs before anything serves.
func (n *Node) startTracing() error {
	if n.cfg.OTLPEndpoint == "" || n.cfg.TracerProvider != nil {
		return nil
	}
	tp, err := tracing.New(tracing.Config{Endpoint: n.cfg.OTLPEndpoint, SampleRatio: max(n.cfg.TraceSample, 0),
		Instance: n.cfg.Name, Version: Version})
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	n.tp = tp
	n.tracer = tp.Tracer(tracerName, trace.WithInstrumentationVersion(Version))
	return nil
}

// traceFlushTimeout bounds how long Shutdown waits for the last spans to reach the collector.
const traceFlushTimeout = 5 * time.Second

// stopTracing flushes and stops the pipeline startTracing built.
func (n *Node) stopTracing(ctx context.Context) error {
	if n.tp == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), traceFlushTimeout)
	defer cancel()
	if err := n.tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("node: flushing traces: %w", err)
	}
	return nil
}

// startRequest starts the ingress's server span of a client request, continuing the client's
// trace when it sent a traceparent.
func (n *Node) startRequest(r *http.Request, endpoint, id string) (context.Context, trace.Span) {
	ctx := tracing.Propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := n.tracer.Start(ctx, spanRequest, trace.WithSpanKind(trace.SpanKindServer))
	if span.IsRecording() { // attributes cost nothing with tracing off
		span.SetAttributes(attrRequestID.String(id), attrEndpoint.String(endpoint),
			attrHTTPMethod.String(r.Method), attrHTTPRoute.String(r.URL.Path))
	}
	return ctx, span
}

// endOutcome records how a request ended on its server span; any end but completion is an
// error status carrying its code.
func endOutcome(span trace.Span, o outcome) {
	if !span.IsRecording() {
		return
	}
	switch {
	case o.completed:
		span.SetAttributes(attrOutcome.String("completed"))
		return
	case o.refused:
		span.SetAttributes(attrOutcome.String("refused"))
	default:
		span.SetAttributes(attrOutcome.String("failed"))
	}
	spanError(span, o.code)
}

// spanError marks span failed with code.
func spanError(span trace.Span, code string) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attrErrorType.String(code))
	span.SetStatus(codes.Error, code)
}

// tenantHash names a tenant in spans without its name: the first 8 bytes of its xxhash, hex.
func tenantHash(tenant string) string {
	return fmt.Sprintf("%016x", xxhash.Sum64String(tenant))
}

// traceDecision records the ingress's admission decision for p and, when it accepts, the
// candidate it chose, on ctx's span.
func traceDecision(ctx context.Context, p *prepared, t *ticket) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attrModel.String(p.adm.Model), attrPriority.Int(p.adm.Priority), attrTenant.String(tenantHash(p.adm.Tenant)))
	decisionAttrs(span, t.D)
	if o := t.D.Option; t.D.Action == admit.Accept && o >= 0 && o < len(t.Cands) {
		c := &t.Cands[o]
		span.SetAttributes(attrPeer.String(c.Name), attrRouteScore.Float64(c.Score), attrRoutePrefix.Int(c.Terms.PrefixTokens),
			attrRouteLoad.Float64(c.Terms.Load), attrRouteTTFT.Float64(c.PredictedTTFT.Seconds()))
	}
}

func decisionAttrs(span trace.Span, d admit.Decision) {
	span.SetAttributes(attrDecision.String(d.Action.String()), attrDecisionLayer.String(d.Layer))
	if d.Code != "" {
		span.SetAttributes(attrDecisionCode.String(d.Code))
	}
}

// startQueue starts the span of a request's wait in the waiting room.
func (n *Node) startQueue(ctx context.Context, d admit.Decision) (context.Context, trace.Span) {
	ctx, span := n.tracer.Start(ctx, spanQueue)
	if span.IsRecording() {
		span.SetAttributes(attrDecisionCode.String(d.Code))
	}
	return ctx, span
}

// startForward starts the client span of one forward attempt to peer and puts its context in
// h, for the owner to continue.
func (n *Node) startForward(ctx context.Context, peer string, h *transport.Header) (context.Context, trace.Span) {
	ctx, span := n.tracer.Start(ctx, spanForward, trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		span.SetAttributes(attrPeer.String(peer))
	}
	tracing.Propagator.Inject(ctx, transportCarrier{h})
	return ctx, span
}

// forwardResult records how a forward attempt ended (the forwards metric's result label) and,
// for a refusal or a failure, the owner's code, else the result.
func forwardResult(span trace.Span, result, code string) {
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
	spanError(span, code)
}

// startOwner starts the owner's server span of a forwarded generation, continuing the
// ingress's trace; other streams (agent leases, the simple endpoints) get none.
func (n *Node) startOwner(ctx context.Context, h transport.Header) (context.Context, trace.Span) {
	if h.Kind != transport.KindRequest || (h.Endpoint != transport.EndpointChat && h.Endpoint != transport.EndpointCompletions) {
		return ctx, trace.SpanFromContext(ctx)
	}
	ctx = tracing.Propagator.Extract(ctx, transportCarrier{&h})
	ctx, span := n.tracer.Start(ctx, spanOwner, trace.WithSpanKind(trace.SpanKindServer))
	if span.IsRecording() {
		span.SetAttributes(attrRequestID.String(h.RequestID), attrIngress.String(h.Ingress), attrEndpoint.String(h.Endpoint.String()),
			attrPriority.Int(h.Priority), attrTenant.String(tenantHash(h.Tenant)))
	}
	return ctx, span
}

// traceOwnerDecision records the owner's admission check of p.
func traceOwnerDecision(span trace.Span, p *prepared, d admit.Decision) {
	if span.IsRecording() {
		span.SetAttributes(attrModel.String(p.adm.Model))
		decisionAttrs(span, d)
	}
}

// traced runs p on the engine inside an engine span, which ends with the stream.
func (n *Node) traced(ctx context.Context, p *prepared) (engine.Stream, error) {
	ctx, span := n.tracer.Start(ctx, spanEngine)
	if !span.IsRecording() {
		span.End() // a no-op span, or one not sampled
		return n.eng.Generate(ctx, &p.req)
	}
	span.SetAttributes(attrModel.String(p.req.Model), attrMaxTokens.Int(p.req.MaxTokens), attrRequestID.String(p.req.ID))
	st, err := n.eng.Generate(ctx, &p.req)
	if err != nil {
		spanError(span, engineError(err).Code)
		span.End()
		return nil, err
	}
	return &tracedStream{Stream: st, span: span, start: time.Now()}, nil
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
		spanError(s.span, "engine_error")
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
