package sim

import (
	"math"
	"math/rand/v2"

	"github.com/cespare/xxhash/v2"
)

// EmbeddingDims is the dimension of the embedded engine's embeddings, and the most a request's
// dimensions may ask for.
const EmbeddingDims = 1024

// Embedding returns the embedded engine's embedding of text under model: dims values (1 to
// EmbeddingDims) of unit length, drawn from a generator seeded by model and text, so the same
// text gives the same vector on every node and every run, and a shorter dims is the longer
// vector's head, renormalised (as OpenAI's dimensions shortens). The vectors carry no meaning:
// two texts are unrelated however alike. It returns nil for dims out of range.
func Embedding(model, text string, dims int) []float32 {
	if dims < 1 || dims > EmbeddingDims {
		return nil
	}
	d := xxhash.New()
	_, _ = d.WriteString(model)
	_, _ = d.Write([]byte{0})
	_, _ = d.WriteString(text)
	seed := d.Sum64()
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	v := make([]float64, dims)
	var norm float64
	for i := range v {
		v[i] = rng.NormFloat64()
		norm += v[i] * v[i]
	}
	norm = math.Sqrt(norm)
	if norm == 0 {
		norm = 1
	}
	out := make([]float32, dims)
	for i, x := range v {
		out[i] = float32(x / norm)
	}
	return out
}
