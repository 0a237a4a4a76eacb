package kvindex

import (
	"fmt"
	"math"
	"sync"
	"testing"
)

type calibSample struct {
	model         string
	bytes, tokens int
}

// repeat is n samples of model, each bytes long and counted as tokens.
func repeat(n int, model string, bytes, tokens int) []calibSample {
	out := make([]calibSample, n)
	for i := range out {
		out[i] = calibSample{model, bytes, tokens}
	}
	return out
}

func newCalibration(t *testing.T, cfg CalibrationConfig) *Calibration {
	t.Helper()
	c, err := NewCalibration(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCalibrationLearnsBytesPerToken pins the learned figure: the 4-byte rule until MinSamples,
// then the engine's own ratio, weighted by prompt size, bounded, per model.
func TestCalibrationLearnsBytesPerToken(t *testing.T) {
	const m = "llama"
	tests := []struct {
		name    string
		cfg     CalibrationConfig
		samples []calibSample
		model   string
		want    float64 // learned figure; 0: not learned (BytesPerToken)
	}{
		{"no sample", CalibrationConfig{}, nil, m, 0},
		{"fewer than min samples", CalibrationConfig{}, repeat(7, m, 4000, 2000), m, 0},
		{"min samples", CalibrationConfig{}, repeat(8, m, 4000, 2000), m, 2},
		{"min samples configured", CalibrationConfig{MinSamples: 3}, repeat(3, m, 3000, 1000), m, 3},
		{"converges to a new ratio", CalibrationConfig{},
			append(repeat(20, m, 4000, 1000), repeat(300, m, 4000, 2000)...), m, 2},
		{"weighted by prompt size", CalibrationConfig{},
			append(repeat(4, m, 40000, 10000), repeat(4, m, 40, 40)...), m, 40040.0 / 10040},
		{"a sample above the ceiling counts at the ceiling", CalibrationConfig{}, repeat(8, m, 100000, 1000), m, 8},
		{"a sample below the floor counts at the floor", CalibrationConfig{}, repeat(8, m, 100, 5000), m, 1},
		{"one odd sample moves it only so far", CalibrationConfig{},
			append(repeat(30, m, 4000, 1000), calibSample{m, 4000, 1_000_000}), m, 4000 / (1000 + 0.05*3000)},
		{"empty samples are ignored", CalibrationConfig{},
			append(repeat(7, m, 4000, 2000), calibSample{m, 0, 10}, calibSample{m, 10, 0}), m, 0},
		{"per model", CalibrationConfig{},
			append(repeat(8, m, 4000, 2000), repeat(8, "qwen", 3000, 1000)...), "qwen", 3},
		{"another model's samples do not count", CalibrationConfig{}, repeat(8, "qwen", 3000, 1000), m, 0},
		{"models past the cap are not learned", CalibrationConfig{MaxModels: 1},
			append(repeat(8, m, 4000, 2000), repeat(8, "qwen", 3000, 1000)...), "qwen", 0},
		{"a capped table still learns its models", CalibrationConfig{MaxModels: 1},
			append(repeat(8, m, 4000, 2000), repeat(8, "qwen", 3000, 1000)...), m, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCalibration(t, tt.cfg)
			for _, s := range tt.samples {
				c.Observe(s.model, s.bytes, s.tokens)
			}
			got, ok := c.BytesPerToken(tt.model)
			if tt.want == 0 {
				if ok || got != BytesPerToken {
					t.Fatalf("BytesPerToken = %v, %v; want the %d-byte rule, not learned", got, ok, BytesPerToken)
				}
				return
			}
			if !ok || math.Abs(got-tt.want) > 1e-3*tt.want {
				t.Fatalf("BytesPerToken = %v, %v; want %v, learned", got, ok, tt.want)
			}
		})
	}
}

// TestCalibrationTokens pins the count prepare uses: Tokens before a model is learned, then
// the ceiling of bytes over the learned figure.
func TestCalibrationTokens(t *testing.T) {
	c := newCalibration(t, CalibrationConfig{MinSamples: 2})
	for _, tt := range []struct {
		name  string
		model string
		bytes int
		want  int
	}{
		{"unknown model: the 4-byte rule", "llama", 4001, 1001},
		{"empty prompt", "llama", 0, 0},
	} {
		if got := c.Tokens(tt.model, tt.bytes); got != tt.want {
			t.Errorf("%s: Tokens(%q, %d) = %d, want %d", tt.name, tt.model, tt.bytes, got, tt.want)
		}
	}
	c.Observe("llama", 6000, 2000)
	if got := c.Tokens("llama", 4001); got != Tokens(4001) {
		t.Errorf("one sample of two: Tokens = %d, want the rule's %d", got, Tokens(4001))
	}
	if f, learned := c.Observe("llama", 6000, 2000); f != 3 || !learned {
		t.Errorf("Observe = %v, %v; want 3, learned", f, learned)
	}
	for _, tt := range []struct {
		bytes, want int
	}{{3000, 1000}, {3001, 1001}, {1, 1}, {0, 0}} {
		if got := c.Tokens("llama", tt.bytes); got != tt.want {
			t.Errorf("learned at 3 bytes a token: Tokens(%d) = %d, want %d", tt.bytes, got, tt.want)
		}
	}
}

// TestCalibrationConfig pins the validation of NewCalibration.
func TestCalibrationConfig(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  CalibrationConfig
		ok   bool
	}{
		{"zero is the defaults", CalibrationConfig{}, true},
		{"defaults", DefaultCalibrationConfig(), true},
		{"alpha over 1", CalibrationConfig{Alpha: 1.5}, false},
		{"negative alpha", CalibrationConfig{Alpha: -0.1}, false},
		{"negative min samples", CalibrationConfig{MinSamples: -1}, false},
		{"floor over ceiling", CalibrationConfig{MinBytesPerToken: 9}, false},
		{"negative floor", CalibrationConfig{MinBytesPerToken: -1}, false},
		{"infinite ceiling", CalibrationConfig{MaxBytesPerToken: math.Inf(1)}, false},
		{"negative max models", CalibrationConfig{MaxModels: -1}, false},
	} {
		_, err := NewCalibration(tt.cfg)
		if (err == nil) != tt.ok {
			t.Errorf("%s: NewCalibration(%+v) error %v, want ok %v", tt.name, tt.cfg, err, tt.ok)
		}
	}
}

// TestCalibrationConcurrent: observers and readers of several models at once (run under
// -race); every sample counts, whatever the interleaving.
func TestCalibrationConcurrent(t *testing.T) {
	c := newCalibration(t, CalibrationConfig{})
	const models, perModel, readers = 4, 200, 4
	var wg sync.WaitGroup
	for i := range models {
		model := fmt.Sprint("m", i)
		wg.Go(func() {
			for range perModel {
				c.Observe(model, 1000*(i+1), 500)
			}
		})
	}
	for range readers {
		wg.Go(func() {
			for j := range perModel {
				_ = c.Tokens(fmt.Sprint("m", j%models), 4096)
			}
		})
	}
	wg.Wait()
	for i := range models {
		want := float64(2 * (i + 1))
		if got, ok := c.BytesPerToken(fmt.Sprint("m", i)); !ok || got != want {
			t.Errorf("m%d: BytesPerToken = %v, %v; want %v", i, got, ok, want)
		}
	}
}
