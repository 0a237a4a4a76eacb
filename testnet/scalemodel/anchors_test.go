package scalemodel

import (
	"math"
	"os"
	"strings"
	"testing"
)

func TestIsAnchor(t *testing.T) {
	var got []int
	for pos := -1; pos < 260; pos++ {
		if IsAnchor(pos) {
			got = append(got, pos)
		}
	}
	want := []int{0, 1, 3, 7, 15, 31, 63, 127, 191, 255}
	if len(got) != len(want) {
		t.Fatalf("anchors %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("anchors %v, want %v", got, want)
		}
	}
}

// TestCountTraceBlocks pins the counting rule: a hash id counts once, the first time it
// appears, and only the prompt's full blocks count.
func TestCountTraceBlocks(t *testing.T) {
	trace := `{"timestamp": 0, "input_length": 1030, "hash_ids": [0, 1, 2]}
{"timestamp": 5, "input_length": 1040, "hash_ids": [0, 1, 3]}
`
	b, err := CountTraceBlocks(strings.NewReader(trace), 512, 16)
	if err != nil {
		t.Fatal(err)
	}
	// Request 1: ids 0, 1 (64 blocks, anchors 0,1,3,7,15,31,63), id 2 holds no full block
	// (1,030 tokens: 64 full). Request 2: id 3 holds block 64 (1,040 tokens: 65 full).
	if want := (TraceBlocks{Requests: 2, New: 65, Anchors: 7}); b != want {
		t.Errorf("got %+v, want %+v", b, want)
	}
	if _, err := CountTraceBlocks(strings.NewReader("{"), 512, 16); err == nil {
		t.Error("a truncated record was accepted")
	}
}

// TestTraceAnchorFraction recomputes DefaultAnchorFraction from the trace, where it is.
func TestTraceAnchorFraction(t *testing.T) {
	f, err := os.Open("/work/shared/traces/mooncake_conversation_trace.jsonl")
	if err != nil {
		t.Skip("no trace:", err)
	}
	defer f.Close()
	b, err := CountTraceBlocks(f, 512, 16)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v: %.5f", b, b.Fraction())
	if math.Abs(b.Fraction()-DefaultAnchorFraction) > 5e-5 {
		t.Errorf("trace's anchor fraction %.5f, DefaultAnchorFraction %.5f", b.Fraction(), DefaultAnchorFraction)
	}
}
