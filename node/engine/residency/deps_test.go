package residency

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/deptest"
)

// TestDeps keeps residency a pure library: the standard library and kvindex (its anchor rule),
// no sockets, no cgo.
func TestDeps(t *testing.T) {
	deptest.Check(t, []string{"github.com/kvmesh/kvmesh/kvindex", "github.com/cespare/xxhash/v2"}, deptest.Sockets)
}
