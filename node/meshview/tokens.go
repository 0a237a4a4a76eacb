package meshview

import (
	"math"
	"sync/atomic"

	"github.com/kvmesh/kvmesh/kvindex"
)

// Tokens counts a model's prompt bytes in its engines' tokens: with the figure this node's
// engine taught it (Learn), else the mean of the figures the model's other nodes publish
// (Refresh), else kvindex's 4-byte rule. An ingress that does not serve a model so counts it
// as the owner will. Safe for concurrent use.
type Tokens struct {
	cal  *kvindex.Calibration
	mesh atomic.Pointer[map[string]float64] // the peers' published figures, by model
}

// NewTokens returns the counts at kvindex's default calibration.
func NewTokens() *Tokens {
	c, err := kvindex.NewCalibration(kvindex.DefaultCalibrationConfig())
	if err != nil {
		panic(err) // the defaults are valid
	}
	return &Tokens{cal: c}
}

// Count is promptBytes of model's rendered prompt in tokens.
func (t *Tokens) Count(model string, promptBytes int) int {
	if _, learned := t.cal.BytesPerToken(model); !learned {
		if mesh := t.mesh.Load(); mesh != nil && (*mesh)[model] > 0 {
			return int(math.Ceil(float64(promptBytes) / (*mesh)[model]))
		}
	}
	return t.cal.Tokens(model, promptBytes)
}

// Refresh takes the mean bytes per token each model's other nodes publish in m (gossip
// ModelInfo.BytesPerToken), so a count reads a map instead of walking the members.
func (t *Tokens) Refresh(m Mesh) {
	if mean := m.BytesPerToken(); mean != nil {
		t.mesh.Store(&mean)
	}
}

// Learn learns model's bytes per token from a run of this node's engine: promptBytes of
// rendered prompt the engine counted as promptTokens. It returns the model's figure and
// whether it changed.
func (t *Tokens) Learn(model string, promptBytes, promptTokens int) (float64, bool) {
	return t.cal.Observe(model, promptBytes, promptTokens)
}

// Learned is the bytes per token this node's engine taught it for model, if it did.
func (t *Tokens) Learned(model string) (float64, bool) { return t.cal.BytesPerToken(model) }
