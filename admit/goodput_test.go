package admit

import (
	"testing"
	"time"
)

func TestSLOTracker(t *testing.T) {
	tr := NewSLOTracker()
	ms := time.Millisecond
	tests := []struct {
		class                    string
		ttft, tpot, ttftS, tpotS time.Duration
		met                      bool
	}{
		{"high", 500 * ms, 50 * ms, time.Second, 100 * ms, true},
		{"high", 1500 * ms, 50 * ms, time.Second, 100 * ms, false},
		{"high", 500 * ms, 150 * ms, time.Second, 100 * ms, false},
		{"low", time.Minute, time.Second, 0, 0, true}, // no targets: met
		{"bogus", 0, 0, time.Second, time.Second, true},
	}
	for _, tt := range tests {
		if got := tr.Record(tt.class, tt.ttft, tt.tpot, tt.ttftS, tt.tpotS); got != tt.met {
			t.Errorf("Record(%+v) = %v", tt, got)
		}
	}
	c := tr.Counts()
	h := c["high"]
	if h != (SLOCounts{Finished: 3, TTFTMet: 2, TPOTMet: 2, Met: 1}) {
		t.Errorf("high = %+v", h)
	}
	if g := h.Goodput(); g < 0.33 || g > 0.34 {
		t.Errorf("goodput %v", g)
	}
	if c["normal"].Finished != 1 || c["low"].Met != 1 || len(c) != 3 {
		t.Errorf("counts %+v (unknown classes fold into normal)", c)
	}
	if (SLOCounts{}).Goodput() != 0 {
		t.Error("empty goodput")
	}
	if Class(3) != "high" || Class(0) != "normal" || Class(-1) != "low" {
		t.Error("Class")
	}
}
