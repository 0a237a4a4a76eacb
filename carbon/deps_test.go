package carbon

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps keeps carbon a pure library: the standard library only (net/http included, for the
// providers), no cgo of its own.
func TestDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if p != "github.com/kvmesh/kvmesh/carbon" {
			t.Errorf("carbon depends on non-standard package %s", p)
		}
	}
	out, err = exec.Command("go", "list", "-f", "{{len .CgoFiles}}", ".").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "0" {
		t.Errorf("carbon has cgo files (%s, %v)", out, err)
	}
}
