package route

import (
	"os/exec"
	"strings"
	"testing"
)

// route is a pure library: std and kvindex (with its hash) only, no sockets, no cgo.
func TestDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	allowed := map[string]bool{
		"github.com/kvmesh/kvmesh/admit/route": true,
		"github.com/kvmesh/kvmesh/kvindex":     true,
		"github.com/cespare/xxhash/v2":         true,
	}
	forbidden := []string{"net", "net/http", "crypto/tls", "runtime/cgo", "os/exec", "plugin"}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list returned too little: %q", out)
	}
	for _, d := range deps {
		first, _, _ := strings.Cut(d, "/")
		if strings.Contains(first, ".") && !allowed[d] {
			t.Errorf("forbidden non-std dependency %s", d)
		}
		for _, f := range forbidden {
			if d == f {
				t.Errorf("forbidden std dependency %s", d)
			}
		}
	}
}
