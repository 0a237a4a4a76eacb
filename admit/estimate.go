package admit

import (
	"math"
	"sync"
)

// series is an exponentially weighted mean and variance of completion lengths.
type series struct {
	n          int
	mean, var_ float64
}

func (s *series) add(x, alpha float64) {
	s.n++
	// Plain running average for the first 1/alpha samples, then EWMA: early samples are not
	// drowned by the zero start, later ones follow drift.
	a := max(alpha, 1/float64(s.n))
	d := x - s.mean
	s.mean += a * d
	s.var_ = (1 - a) * (s.var_ + a*d*d)
}

// estimator learns output lengths per (model, tenant) and per model.
type estimator struct {
	mu         sync.Mutex
	alpha      float64
	sigmas     float64
	minSamples int
	maxSeries  int
	m          map[string]*series
}

func newEstimator(b BudgetConfig) *estimator {
	return &estimator{alpha: b.EstimateAlpha, sigmas: b.EstimateSigmas, minSamples: b.EstimateMinSamples,
		maxSeries: b.EstimateMaxSeries, m: make(map[string]*series)}
}

func seriesKey(model, tenant string) string { return model + "\x00" + tenant }

func (e *estimator) observe(model, tenant string, tokens int) {
	if tokens < 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	keys := []string{seriesKey(model, "")}
	if tenant != "" {
		keys = append(keys, seriesKey(model, tenant))
	}
	for _, k := range keys {
		s, ok := e.m[k]
		if !ok {
			if len(e.m) >= e.maxSeries {
				continue // bounded memory: new series are dropped, the model's keeps learning
			}
			s = &series{}
			e.m[k] = s
		}
		s.add(float64(tokens), e.alpha)
	}
}

// expected returns the output tokens to reserve: mean + sigmas·stddev from the tenant's
// series, else the model's, once confident; else maxTokens (the worst case).
func (e *estimator) expected(model, tenant string, maxTokens int) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	var s *series
	if tenant != "" {
		s = e.m[seriesKey(model, tenant)]
	}
	if s == nil || s.n < e.minSamples {
		s = e.m[seriesKey(model, "")]
	}
	if s == nil || s.n < e.minSamples {
		return maxTokens
	}
	v := math.Ceil(s.mean + e.sigmas*math.Sqrt(max(s.var_, 0)))
	if !(v < float64(maxTokens)) {
		return maxTokens
	}
	return max(int(v), 1)
}
