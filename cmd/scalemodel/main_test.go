package main

import (
	"os"
	"path/filepath"
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

// TestTraceSetsTheAnchorFraction pins -trace: the fraction is the trace's, and said.
func TestTraceSetsTheAnchorFraction(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	// One 1,024-token prompt: 64 new blocks, 7 anchors.
	if err := os.WriteFile(path, []byte(`{"timestamp": 0, "input_length": 1024, "hash_ids": [0, 1]}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	args := []string{"-trace", path, "-nodes", "8", "-domain", "0", "-warmup", "1s", "-duration", "1s", "-probes", "1"}
	if err := run(args, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "64 new blocks, 7 anchors: anchor fraction 0.10938") {
		t.Errorf("output:\n%s", out.String())
	}
}

// TestLightIsTheBenchmarksRun pins -light: records every 5 s (the mesh interval at 16 nodes),
// unless a flag set explicitly says otherwise.
func TestLightIsTheBenchmarksRun(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-light"}, "| 16 | 1 × 16 | 5.0 s |"},
		{[]string{"-light", "-publish-interval", "2s"}, "| 16 | 1 × 16 | 2.0 s |"},
	} {
		var out strings.Builder
		args := append(tc.args, "-nodes", "16", "-domain", "0", "-warmup", "1s", "-duration", "5s")
		if err := run(args, &out); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), tc.want) {
			t.Errorf("%v: output\n%s\nwant a row starting %q", tc.args, out.String(), tc.want)
		}
	}
}
