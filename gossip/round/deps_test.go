package round

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/deptest"
)

// TestDeps keeps round a pure planner: the standard library without sockets, no memberlist,
// no cgo.
func TestDeps(t *testing.T) {
	deptest.Check(t, nil, deptest.Sockets)
}
