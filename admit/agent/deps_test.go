package agent

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps keeps agent a pure library: the standard library only, without sockets or cgo.
func TestDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{.Standard}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const self = "github.com/kvmesh/kvmesh/admit/agent"
	forbidden := map[string]bool{"net": true, "net/http": true, "os/exec": true, "syscall/js": true, "runtime/cgo": true}
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		seen++
		pkg, std := f[0], f[1] == "true"
		if !std && pkg != self {
			t.Errorf("agent depends on non-standard package %s", pkg)
		}
		if forbidden[pkg] {
			t.Errorf("agent depends on forbidden package %s", pkg)
		}
	}
	if seen < 5 {
		t.Fatalf("go list returned only %d packages: %s", seen, out)
	}
	out, err = exec.Command("go", "list", "-f", "{{len .CgoFiles}}", ".").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "0" {
		t.Errorf("agent has cgo files (%s, %v)", out, err)
	}
}
