package loadgen

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps keeps the load generator a client of the public API only: std, plus kvmesh's OpenAI
// wire types. It must not link the node, the mesh or their transports.
func TestDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	allowed := map[string]bool{
		"github.com/kvmesh/kvmesh/testnet/loadgen": true,
		"github.com/kvmesh/kvmesh/node/openai":     true,
	}
	for _, p := range strings.Fields(string(out)) {
		if !allowed[p] {
			t.Errorf("forbidden dependency %s", p)
		}
	}
}
