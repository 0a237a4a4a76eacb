package journey

import (
	"context"

	"go.opentelemetry.io/otel/trace"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/node/tracing"
)

// EndOutcome records how a request ended on its server span.
func EndOutcome(span trace.Span, o Outcome) {
	tracing.End(span, o.Completed, o.Refused, o.Code)
}

// TraceDecision records the ingress's admission decision for p and, when it accepts, the
// candidate it chose, on ctx's span.
func TraceDecision(ctx context.Context, p *Request, t *Ticket) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	tracing.RequestAttrs(span, p.Adm.Model, p.Adm.Priority, p.Adm.Tenant)
	tracing.Decision(span, t.D.Action.String(), t.D.Layer, t.D.Code)
	if o := t.D.Option; t.D.Action == admit.Accept && o >= 0 && o < len(t.Cands) {
		c := &t.Cands[o]
		tracing.Route(span, c.Name, c.Score, c.Terms.PrefixTokens, c.Terms.Load, c.PredictedTTFT)
	}
}
