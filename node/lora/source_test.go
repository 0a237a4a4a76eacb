package lora

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestReadSourceDirectory(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"sql", "chat-v2", ".cache"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "README"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	src, err := ReadSource(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(src) != 2 || src["sql"].Path != filepath.Join(dir, "sql") || src["chat-v2"].Base != "" {
		t.Errorf("got %v", src)
	}
}

func TestReadSourceJSON(t *testing.T) {
	f := filepath.Join(t.TempDir(), "adapters.json")
	data := `{"sql": "/models/sql", "hub": {"path": "org/repo", "base": "llama"}}`
	if err := os.WriteFile(f, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	src, err := ReadSource(f)
	if err != nil {
		t.Fatal(err)
	}
	if src["sql"] != (Entry{Path: "/models/sql"}) || src["hub"] != (Entry{Path: "org/repo", Base: "llama"}) {
		t.Errorf("got %v", src)
	}
}

func TestParseSourceRefuses(t *testing.T) {
	for _, bad := range []string{
		`[]`, `{"a": ""}`, `{"a": 3}`, `{"a b": "/x"}`, `{"a,b": "/x"}`, `{"": "/x"}`,
		`{"a": {"path": "/x", "rank": 8}}`, `{"a": {"base": "m"}}`,
	} {
		if _, err := ParseSource([]byte(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	if _, err := ReadSource(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, ErrSource) {
		t.Errorf("a missing source: %v", err)
	}
}
