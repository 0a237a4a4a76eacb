package admit

import (
	"sync"
	"time"
)

// SLOCounts are one class's goodput counters.
type SLOCounts struct {
	Finished int64 // requests that completed (served to the end)
	TTFTMet  int64 // of those, TTFT within target (or no target)
	TPOTMet  int64 // TPOT within target (or no target)
	Met      int64 // both: the goodput numerator
}

// Goodput is Met/Finished, 0 with nothing finished.
func (c SLOCounts) Goodput() float64 {
	if c.Finished == 0 {
		return 0
	}
	return float64(c.Met) / float64(c.Finished)
}

// SLOTracker counts finished requests against their SLOs per priority class (Class). The node
// feeds it from its accounting step and exports the counts. Safe for concurrent use.
type SLOTracker struct {
	mu sync.Mutex
	m  map[string]*SLOCounts
}

// NewSLOTracker returns an empty tracker.
func NewSLOTracker() *SLOTracker { return &SLOTracker{m: make(map[string]*SLOCounts)} }

// Record counts one finished request of class (Class(priority)); a zero target always counts
// as met. It returns whether both targets were met.
func (t *SLOTracker) Record(class string, ttft, tpot, ttftSLO, tpotSLO time.Duration) bool {
	switch class {
	case "high", "normal", "low":
	default:
		class = "normal" // bounded label set
	}
	okTTFT := ttftSLO <= 0 || ttft <= ttftSLO
	okTPOT := tpotSLO <= 0 || tpot <= tpotSLO
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.m[class]
	if c == nil {
		c = &SLOCounts{}
		t.m[class] = c
	}
	c.Finished++
	if okTTFT {
		c.TTFTMet++
	}
	if okTPOT {
		c.TPOTMet++
	}
	if okTTFT && okTPOT {
		c.Met++
	}
	return okTTFT && okTPOT
}

// Counts returns a copy of the counters by class.
func (t *SLOTracker) Counts() map[string]SLOCounts {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]SLOCounts, len(t.m))
	for k, c := range t.m {
		out[k] = *c
	}
	return out
}
