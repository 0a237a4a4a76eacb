package provider

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestTokenFromEnvOrFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("  from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const env = "KVMESH_TEST_CARBON_TOKEN"
	tests := []struct {
		name    string
		envVal  string
		file    string
		want    string
		wantErr error
	}{
		{"env wins", "from-env", file, "from-env", nil},
		{"file when env empty", "", file, "from-file", nil},
		{"blank env falls to file", "   ", file, "from-file", nil},
		{"empty file", "", empty, "", ErrNoToken},
		{"nothing", "", "", "", ErrNoToken},
		{"missing file", "", filepath.Join(dir, "nope"), "", os.ErrNotExist},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(env, tt.envVal)
			got, err := TokenFromEnvOrFile(env, tt.file)
			if got != tt.want || (tt.wantErr == nil) != (err == nil) || (tt.wantErr != nil && !errors.Is(err, tt.wantErr)) {
				t.Fatalf("got %q, %v; want %q, %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}
