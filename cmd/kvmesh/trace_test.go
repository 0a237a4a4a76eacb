package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMissingTraceNamesTheMakeTarget: bench and load refuse a --trace file that does not
// exist, before starting anything, with an error that says how to get the trace.
func TestMissingTraceNamesTheMakeTarget(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "mooncake_conversation_trace.jsonl")
	for _, args := range [][]string{
		{"bench", "--trace", missing},
		{"load", "--target", "http://127.0.0.1:1", "--trace", missing},
	} {
		_, err := run(t, args...)
		if err == nil || !strings.Contains(err.Error(), "make trace") || !strings.Contains(err.Error(), defaultTrace) ||
			!strings.Contains(err.Error(), missing) {
			t.Errorf("kvmesh %s: error %v; want one naming the file, make trace and %s", strings.Join(args, " "), err, defaultTrace)
		}
	}
}

// TestTraceTargetMatchesTheDocs: the Makefile's trace target downloads to the path the CLI's
// error and the README name, checks a checksum, and CI does not run it (it needs the network).
func TestTraceTargetMatchesTheDocs(t *testing.T) {
	read := func(path string) string {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	mk := read("../../Makefile")
	for _, want := range []string{"\ntrace:", "TRACE ?= " + defaultTrace, "TRACE_SHA256 := ", "TRACE_URL ?= https://"} {
		if !strings.Contains(mk, want) {
			t.Errorf("Makefile lacks %q", want)
		}
	}
	if readme := read("../../README.md"); !strings.Contains(readme, "make trace") || !strings.Contains(readme, "--trace "+defaultTrace) {
		t.Errorf("README.md does not say make trace and bench --trace %s", defaultTrace)
	}
	if ci := read("../../.ci/run"); strings.Contains(ci, "make trace") {
		t.Errorf(".ci/run runs make trace, which needs the network")
	}
}
