package carbon

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/deptest"
)

// TestDeps keeps carbon a pure library: the standard library without sockets, no cgo. The
// network providers live in carbon/provider, which imports carbon, never the other way.
func TestDeps(t *testing.T) {
	deptest.Check(t, nil, deptest.Sockets)
}
