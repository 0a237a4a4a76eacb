package journey

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/admit/route"
)

// TestConsoleCandidateKeepsPredictions pins what the console records of a candidate: its
// predicted TTFT and TPOT survive, in seconds, under the JSON names the page reads, even
// when they are fractions of a millisecond (a fast engine's).
func TestConsoleCandidateKeepsPredictions(t *testing.T) {
	c := route.Candidate{Name: "n1", Score: 0.5, PredictedTTFT: 280 * time.Microsecond, PredictedTPOT: 250 * time.Microsecond,
		Terms: route.Terms{LoadTokens: 7}}
	b, err := json.Marshal(consoleCandidate(&c))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]float64{"ttft_seconds": 0.00028, "tpot_seconds": 0.00025, "load_tokens": 7, "score": 0.5} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v (in %s)", k, got[k], want, b)
		}
	}
}
