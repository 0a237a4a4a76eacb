// Package deptest keeps kvmesh's libraries to the dependencies their design allows: each pure
// package's deps_test.go calls Check. It is for tests only.
package deptest

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// Sockets are what a pure library must not reach, even through the standard library.
var Sockets = []string{"net", "net/http", "crypto/tls", "os/exec", "plugin", "syscall/js", "runtime/cgo"}

// Check fails t if the package in the working directory (a test's own package) depends,
// directly or not, on a non-standard package other than itself and allowed, on one of
// forbidden, or has cgo files.
func Check(t *testing.T, allowed, forbidden []string) {
	t.Helper()
	self := goList(t, "-f", "{{.ImportPath}}", ".")
	deps := strings.Split(goList(t, "-deps", "-f", "{{.ImportPath}} {{.Standard}}", "."), "\n")
	if len(deps) < 2 {
		t.Fatalf("go list -deps returned only %q", deps)
	}
	for _, line := range deps {
		pkg, std, _ := strings.Cut(line, " ")
		if std != "true" && pkg != self && !slices.Contains(allowed, pkg) {
			t.Errorf("%s depends on %s, which its design does not allow", self, pkg)
		}
		if slices.Contains(forbidden, pkg) {
			t.Errorf("%s depends on forbidden package %s", self, pkg)
		}
	}
	if n := goList(t, "-f", "{{len .CgoFiles}}", "."); n != "0" {
		t.Errorf("%s has %s cgo files", self, n)
	}
}

func goList(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}
