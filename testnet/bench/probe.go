package bench

import (
	"context"
	"fmt"
	"math"

	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet/loadgen"
)

// maxProbeDoublings bounds the probe's search for a rate the baseline cannot serve.
const maxProbeDoublings = 8

// ProbePolicy is the baseline whose SLO knee defines capacity: cache-aware routing without
// admission, what a fleet would run without kvmesh. Its engines schedule as
// Config.BaselineScheduling says.
var ProbePolicy = Policy{Name: "probe", Route: route.PolicyCacheAware, Admission: node.AdmissionNone}

// probePolicy is ProbePolicy on engines scheduled as the baselines' are.
func (b *bencher) probePolicy() Policy {
	p := ProbePolicy
	if b.adapters() {
		p.Route = route.PolicyLoRAAffinity // cache-aware routing knows no adapters
	}
	p.EngineScheduling = b.cfg.BaselineScheduling
	return p
}

// probe measures the mesh's capacity (see the package doc) on its own testnet: the highest
// offered rate at which ProbePolicy still meets ProbeAttainment, found by doubling the rate
// until a step misses it and then bisecting.
func (b *bencher) probe(ctx context.Context) (*Probe, error) {
	pp := b.probePolicy()
	tn, err := b.start(ctx, pp)
	if err != nil {
		return nil, err
	}
	defer tn.Close()
	pr := &Probe{Policy: pp.Route, EngineScheduling: pp.EngineScheduling, Attainment: b.cfg.ProbeAttainment}
	step := func(rate float64) (bool, error) {
		s := b.cfg.TimeScale
		b.progressf("capacity probe: %.2f req/s (simulated) for %s", rate, b.cfg.ProbeDuration)
		// A request with no answer a batch TTFT SLO after the window has missed its SLO
		// whatever its class: the step is cut there, and what it cut counts as missed.
		sctx, cancel := context.WithTimeout(ctx, b.cfg.ProbeDuration+scaleDur(b.cfg.Batch.TTFT, s))
		rep, err := loadgen.Run(sctx, b.load(tn.URLs(), rate*s, b.cfg.ProbeDuration))
		cancel()
		if ctx.Err() != nil {
			return false, fmt.Errorf("bench: probe: %w", ctx.Err())
		}
		if rep == nil {
			return false, fmt.Errorf("bench: probe: %w", err)
		}
		st := ProbeStep{OfferedRPS: rate, Sent: rep.Sent, Good: rep.Good, Attainment: rep.Attainment}
		pr.Steps = append(pr.Steps, st)
		return rep.Sent > 0 && st.Attainment >= b.cfg.ProbeAttainment, nil
	}
	lo, err := searchKnee(b.cfg.ProbeRate, b.cfg.ProbeSteps, step)
	if err != nil {
		return pr, err
	}
	pr.Capacity = lo
	b.progressf("capacity: %.2f req/s (simulated)", pr.Capacity)
	return pr, nil
}

// searchKnee returns the highest rate at which met holds, assuming it holds below some knee and
// not above: from start it doubles (or halves) the rate until one rate meets and its double
// does not, then bisects that octave geometrically steps times.
func searchKnee(start float64, steps int, met func(rate float64) (bool, error)) (float64, error) {
	lo, hi := 0.0, 0.0 // the highest rate met, the lowest missed
	for rate, n := start, 0; lo == 0 || hi == 0; n++ {
		if n >= maxProbeDoublings {
			return 0, fmt.Errorf("%w: after %d steps from %.3g req/s, no rate met the SLO target below one that missed it",
				ErrProbe, n, start)
		}
		ok, err := met(rate)
		if err != nil {
			return 0, err
		}
		if ok {
			lo, rate = rate, rate*2
		} else {
			hi, rate = rate, rate/2
		}
	}
	for range steps {
		mid := math.Sqrt(lo * hi)
		ok, err := met(mid)
		if err != nil {
			return 0, err
		}
		if ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, nil
}
