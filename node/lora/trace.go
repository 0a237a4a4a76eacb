package lora

import (
	"context"
	"time"
)

// Trace is told the steps of one Acquire, as net/http/httptrace's ClientTrace is told those
// of a request: WithTrace puts it in the context Acquire is given. Its functions are called
// on Acquire's goroutine, without the Loader's lock held; a nil one is skipped.
type Trace struct {
	// Waited: the call waited, for took, for another request's flight on the adapter (its
	// load, or its unload to make room for another adapter).
	Waited func(took time.Duration)
	// Unloaded: the call unloaded victim, the least recently used idle adapter, to make
	// room, which took took; err is the engine's failure.
	Unloaded func(victim string, took time.Duration, err error)
	// Loaded: the call ran the adapter's load (its unload to make room included), which
	// ended with outcome (OutcomeLoaded, OutcomeFailed, OutcomeTimeout) after took.
	Loaded func(outcome string, took time.Duration)
}

type traceKey struct{}

// WithTrace returns ctx carrying t for the Acquire it is given to.
func WithTrace(ctx context.Context, t *Trace) context.Context {
	return context.WithValue(ctx, traceKey{}, t)
}

// traceOf returns the Trace ctx carries, or nil.
func traceOf(ctx context.Context) *Trace {
	t, _ := ctx.Value(traceKey{}).(*Trace)
	return t
}

func (t *Trace) waited(took time.Duration) {
	if t != nil && t.Waited != nil {
		t.Waited(took)
	}
}

func (t *Trace) unloaded(victim string, took time.Duration, err error) {
	if t != nil && t.Unloaded != nil {
		t.Unloaded(victim, took, err)
	}
}

func (t *Trace) loaded(outcome string, took time.Duration) {
	if t != nil && t.Loaded != nil {
		t.Loaded(outcome, took)
	}
}
