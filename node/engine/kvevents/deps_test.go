package kvevents

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps keeps kvevents pure Go and a leaf: no cgo (zmq4's libczmq bindings stay out of the
// build), and no other kvmesh package.
func TestDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{len .CgoFiles}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, cgo, _ := strings.Cut(line, " ")
		switch {
		case strings.Contains(pkg, "goczmq"):
			t.Errorf("kvevents depends on %s, a cgo binding", pkg)
		case strings.HasPrefix(pkg, "github.com/kvmesh/kvmesh/") && pkg != "github.com/kvmesh/kvmesh/node/engine/kvevents":
			t.Errorf("kvevents depends on %s: it must stay a leaf", pkg)
		case pkg == "github.com/kvmesh/kvmesh/node/engine/kvevents" && cgo != "0":
			t.Errorf("kvevents has %s cgo files", cgo)
		}
	}
}
