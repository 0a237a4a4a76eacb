package admit

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps keeps admit a pure library: the standard library without sockets, plus
// golang.org/x/time/rate, and no cgo.
func TestDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{.Standard}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	allowed := map[string]bool{"github.com/kvmesh/kvmesh/admit": true, "golang.org/x/time/rate": true}
	forbidden := []string{"net", "net/http", "os/exec", "syscall/js", "runtime/cgo", "github.com/kvmesh/kvmesh/admit/route"}
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		seen++
		pkg, std := f[0], f[1] == "true"
		if !std && !allowed[pkg] {
			t.Errorf("admit depends on non-standard package %s", pkg)
		}
		for _, bad := range forbidden {
			if pkg == bad {
				t.Errorf("admit depends on forbidden package %s", pkg)
			}
		}
	}
	if seen < 5 {
		t.Fatalf("go list returned only %d packages: %s", seen, out)
	}
	out, err = exec.Command("go", "list", "-f", "{{len .CgoFiles}}", ".").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "0" {
		t.Errorf("admit has cgo files (%s, %v)", out, err)
	}
}
