package adapters

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/kvmesh/kvmesh/node/lora"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/tracing"
)

// A load's span (tracing.Spans.AdapterLoad): the loader tells one acquire's steps to a
// lora.Trace, and the span is recorded once the acquire returns, when it loaded, waited or
// failed. With the request's span not recording nothing is collected.

// loadTrace collects one acquire's steps.
type loadTrace struct {
	rec         tracing.AdapterLoad
	ran, waited bool // this acquire ran a load; it waited for another's
}

// startTrace returns the trace of an acquire of model under ctx, and ctx carrying it; nil
// when ctx's span does not record.
func (set *Set) startTrace(ctx context.Context, model string) (context.Context, *loadTrace) {
	if set.spans == nil || !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, nil
	}
	lt := &loadTrace{rec: tracing.AdapterLoad{Adapter: model, Node: set.cfg.Name, API: set.api, Start: time.Now()}}
	r := &lt.rec
	return lora.WithTrace(ctx, &lora.Trace{
		Waited: func(took time.Duration) { lt.waited, r.Wait = true, r.Wait+took },
		Unloaded: func(victim string, took time.Duration, err error) {
			r.Unloads = append(r.Unloads, tracing.AdapterUnload{Adapter: victim, At: time.Now(), Took: took, Err: err})
		},
		Loaded: func(outcome string, took time.Duration) { lt.ran, r.Outcome, r.Load = true, outcome, took },
	}), lt
}

// endTrace records the span of lt, the acquire having returned err (nil: the adapter is held),
// unless the engine held the adapter already.
func (set *Set) endTrace(ctx context.Context, lt *loadTrace, err error) {
	if lt == nil || (err == nil && !lt.ran && !lt.waited) {
		return
	}
	r := &lt.rec
	r.End, r.Err = time.Now(), err
	switch {
	case err == nil && !lt.ran:
		r.Outcome = "waited"
	case err == nil:
	case ctx.Err() != nil:
		r.Outcome, r.Code = "cancelled", openai.CodeClientClosed
	default:
		r.Outcome, r.Code = failureOutcome(err), (&adapterError{err: err, node: set.cfg.Name}).APIError().Code
	}
	set.spans.AdapterLoad(ctx, r)
}

// failureOutcome names a loader's failure in a load's span.
func failureOutcome(err error) string {
	switch {
	case errors.Is(err, lora.ErrNoIdleSlot):
		return "slots_busy"
	case errors.Is(err, lora.ErrNotInSource):
		return "not_in_source"
	case errors.Is(err, lora.ErrLoadTimeout):
		return lora.OutcomeTimeout
	}
	return lora.OutcomeFailed
}
