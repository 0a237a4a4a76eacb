package kvindex

import (
	"errors"
	"math"
	"sync"
)

// Calibration defaults (CalibrationConfig's zero fields).
const (
	DefaultCalibrationAlpha      = 0.05
	DefaultCalibrationMinSamples = 8
	DefaultMinBytesPerToken      = 1.0
	DefaultMaxBytesPerToken      = 8.0
	DefaultCalibrationMaxModels  = 64
)

// CalibrationConfig shapes a Calibration. Zero fields take their defaults.
type CalibrationConfig struct {
	// Alpha is the weight of a new sample in the moving averages (0.05: about the last 20
	// requests dominate). The first 1/Alpha samples are averaged plainly, so the first few do
	// not start from a made-up value.
	Alpha float64
	// MinSamples is how many samples a model needs before its learned figure replaces
	// BytesPerToken.
	MinSamples int
	// MinBytesPerToken and MaxBytesPerToken bound a sample, and so the learned figure: one odd
	// request (an image's tokens, a broken usage) moves the average only so far.
	MinBytesPerToken, MaxBytesPerToken float64
	// MaxModels bounds the models learned; samples of further models are dropped and their
	// prompts counted by BytesPerToken.
	MaxModels int
}

// DefaultCalibrationConfig returns the defaults.
func DefaultCalibrationConfig() CalibrationConfig {
	return CalibrationConfig{
		Alpha:            DefaultCalibrationAlpha,
		MinSamples:       DefaultCalibrationMinSamples,
		MinBytesPerToken: DefaultMinBytesPerToken,
		MaxBytesPerToken: DefaultMaxBytesPerToken,
		MaxModels:        DefaultCalibrationMaxModels,
	}
}

// Calibration learns, per model, how many bytes of rendered prompt an engine's tokeniser makes
// one token, from the engine's own count of finished requests' prompts. Real tokenisers differ
// by model and by text (English prose near 4 bytes a token, code and CJK text fewer), while
// BytesPerToken is one rule for all. The learned figure only counts a prompt's tokens; the block
// rule (AppendBlocks) keeps BytesPerToken, so block hashes stay the same on every node.
//
// The figure is the ratio of two moving averages, of the prompts' bytes and of their tokens,
// so it is weighted by prompt size: long prompts, where a wrong count costs most, decide it,
// and a short prompt's chat-template overhead hardly moves it.
//
// A Calibration is safe for concurrent use. Create it with NewCalibration.
type Calibration struct {
	cfg    CalibrationConfig
	mu     sync.Mutex
	models map[string]*calibSeries
}

// calibSeries is one model's moving averages.
type calibSeries struct {
	n             int
	bytes, tokens float64
}

// NewCalibration fills cfg's zero fields with their defaults and validates it.
func NewCalibration(cfg CalibrationConfig) (*Calibration, error) {
	d := DefaultCalibrationConfig()
	if cfg.Alpha == 0 {
		cfg.Alpha = d.Alpha
	}
	if cfg.MinSamples == 0 {
		cfg.MinSamples = d.MinSamples
	}
	if cfg.MinBytesPerToken == 0 {
		cfg.MinBytesPerToken = d.MinBytesPerToken
	}
	if cfg.MaxBytesPerToken == 0 {
		cfg.MaxBytesPerToken = d.MaxBytesPerToken
	}
	if cfg.MaxModels == 0 {
		cfg.MaxModels = d.MaxModels
	}
	switch {
	case !(cfg.Alpha > 0 && cfg.Alpha <= 1):
		return nil, errors.New("kvindex: calibration alpha must be in (0, 1]")
	case cfg.MinSamples < 1:
		return nil, errors.New("kvindex: calibration min samples must be at least 1")
	case !(cfg.MinBytesPerToken > 0 && cfg.MinBytesPerToken <= cfg.MaxBytesPerToken) || math.IsInf(cfg.MaxBytesPerToken, 0):
		return nil, errors.New("kvindex: calibration bytes per token bounds must be finite, positive and ordered")
	case cfg.MaxModels < 1:
		return nil, errors.New("kvindex: calibration max models must be at least 1")
	}
	return &Calibration{cfg: cfg, models: map[string]*calibSeries{}}, nil
}

// Observe learns from one finished request of model: promptBytes of rendered prompt that the
// engine counted as engineTokens. A sample without bytes or tokens is ignored. It returns the
// model's figure now (BytesPerToken until MinSamples) and whether the model is learned at all
// (false once MaxModels other models are).
func (c *Calibration) Observe(model string, promptBytes, engineTokens int) (bytesPerToken float64, learned bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	valid := promptBytes > 0 && engineTokens > 0
	s := c.models[model]
	if s == nil {
		if !valid || len(c.models) >= c.cfg.MaxModels {
			return BytesPerToken, false
		}
		s = &calibSeries{}
		c.models[model] = s
	}
	if valid {
		b := float64(promptBytes)
		t := min(max(float64(engineTokens), b/c.cfg.MaxBytesPerToken), b/c.cfg.MinBytesPerToken)
		s.n++
		w := max(c.cfg.Alpha, 1/float64(s.n))
		s.bytes += w * (b - s.bytes)
		s.tokens += w * (t - s.tokens)
	}
	f, _ := c.factorLocked(s)
	return f, true
}

// factorLocked is s's figure and whether it is learned (else BytesPerToken).
func (c *Calibration) factorLocked(s *calibSeries) (float64, bool) {
	if s == nil || s.n < c.cfg.MinSamples || !(s.tokens > 0) {
		return BytesPerToken, false
	}
	return min(max(s.bytes/s.tokens, c.cfg.MinBytesPerToken), c.cfg.MaxBytesPerToken), true
}

// BytesPerToken returns model's learned bytes per token, or BytesPerToken and false before
// MinSamples.
func (c *Calibration) BytesPerToken(model string) (float64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.factorLocked(c.models[model])
}

// Tokens counts promptBytes of model's rendered prompt in the engine's tokens: ceil(bytes ÷
// the learned figure), or Tokens(promptBytes) before the model is learned.
func (c *Calibration) Tokens(model string, promptBytes int) int {
	f, ok := c.BytesPerToken(model)
	if !ok || promptBytes <= 0 {
		return Tokens(promptBytes)
	}
	return int(math.Ceil(float64(promptBytes) / f))
}
