package residency

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/deptest"
)

// TestDeps keeps residency a pure library: the standard library alone, no sockets, no cgo.
func TestDeps(t *testing.T) {
	deptest.Check(t, nil, deptest.Sockets)
}
