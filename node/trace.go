package node

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/kvmesh/kvmesh/node/tracing"
	"github.com/kvmesh/kvmesh/node/transport"
)

// Tracing (docs/operating.md#tracing): the spans are node/tracing's; this file ties them to
// the node's pipeline and request types.

// buildTracer sets the spans New's parts use: Config.TracerProvider's, else a no-op one until
// Start builds the OTLP pipeline.
func (n *Node) buildTracer() {
	n.spans = tracing.NewSpans(n.cfg.TracerProvider, Version)
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
	n.spans = tracing.NewSpans(tp, Version)
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

func (n *Node) startOwner(ctx context.Context, h transport.Header) (context.Context, trace.Span) {
	return n.spans.Owner(ctx, h)
}

var (
	forwardResult = tracing.ForwardResult
	spanError     = tracing.Error
)
