package openai

import (
	"os/exec"
	"strings"
	"testing"
)

// TestStdOnly keeps the wire package importable by clients (loadgen) without the world.
func TestStdOnly(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if p != "github.com/kvmesh/kvmesh/node/openai" {
			t.Errorf("node/openai imports non-std package %s", p)
		}
	}
}
