package sim

import (
	"math"
	"slices"
	"testing"
)

// TestEmbeddingIsDeterministicUnitAndSeededByText pins the embedded engine's embeddings: the
// same model and text give the same vector, another text or model another one, every vector
// has unit length, and a shorter one is the longer one's head renormalised.
func TestEmbeddingIsDeterministicUnitAndSeededByText(t *testing.T) {
	a := Embedding("m", "hello", EmbeddingDims)
	if len(a) != EmbeddingDims {
		t.Fatalf("%d values", len(a))
	}
	if !slices.Equal(a, Embedding("m", "hello", EmbeddingDims)) {
		t.Error("not deterministic")
	}
	if slices.Equal(a, Embedding("m", "hello!", EmbeddingDims)) || slices.Equal(a, Embedding("n", "hello", EmbeddingDims)) {
		t.Error("text and model do not seed the vector")
	}
	short := Embedding("m", "hello", 8)
	for _, v := range [][]float32{a, short, Embedding("m", "x", 1)} {
		var s float64
		for _, x := range v {
			s += float64(x) * float64(x)
		}
		if math.Abs(s-1) > 1e-5 {
			t.Errorf("length² %v for %d dims", s, len(v))
		}
	}
	// The head keeps its direction: the ratios between the first values are a's.
	if r1, r2 := short[1]/short[0], a[1]/a[0]; math.Abs(float64(r1-r2)) > 1e-4*math.Abs(float64(r2)) {
		t.Errorf("shortened vector is not a's head: %v vs %v", r1, r2)
	}
	if Embedding("m", "x", 0) != nil || Embedding("m", "x", EmbeddingDims+1) != nil {
		t.Error("dims out of range gave a vector")
	}
}
