package carbon

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/deptest"
)

// TestDeps keeps carbon to the standard library (net/http for its providers is the one edge)
// and no cgo files of its own.
func TestDeps(t *testing.T) {
	deptest.Check(t, nil, []string{"os/exec", "plugin"})
}
