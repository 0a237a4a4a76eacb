package kvindex

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps keeps kvindex a pure library: the standard library without sockets, plus xxhash.
func TestDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{.Standard}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	allowed := map[string]bool{"github.com/kvmesh/kvmesh/kvindex": true, "github.com/cespare/xxhash/v2": true}
	forbidden := map[string]bool{"net": true, "net/http": true, "os/exec": true, "runtime/cgo": true}
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		seen++
		if f[1] != "true" && !allowed[f[0]] {
			t.Errorf("kvindex depends on non-standard package %s", f[0])
		}
		if forbidden[f[0]] {
			t.Errorf("kvindex depends on forbidden package %s", f[0])
		}
	}
	if seen < 5 {
		t.Fatalf("go list returned only %d packages: %s", seen, out)
	}
}
