package main

import (
	"strings"
	"testing"
)

// TestTablePrintsARowPerScenario pins the command's output: a header, then for each size a
// row with one model and a row with models of -domain nodes.
func TestTablePrintsARowPerScenario(t *testing.T) {
	var out strings.Builder
	args := []string{"-nodes", "16,32", "-domain", "8", "-churn", "0", "-warmup", "1s", "-duration", "2s", "-probes", "2"}
	if err := run(args, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{"| nodes |", "| --- |", "| 16 | 1 × 16 |", "| 16 | 2 × 8 |", "| 32 | 1 × 32 |", "| 32 | 4 × 8 |"}
	if len(lines) != len(want) {
		t.Fatalf("%d lines:\n%s", len(lines), out.String())
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d = %q, want it to start %q", i, lines[i], w)
		}
	}
	if err := run([]string{"-nodes", "1"}, &out); err == nil {
		t.Error("-nodes 1 accepted")
	}
}
