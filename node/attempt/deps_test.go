package attempt

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/deptest"
)

// TestDeps keeps attempt a pure library: the standard library without sockets and nothing
// else, so that the request's journey is planned without a mesh.
func TestDeps(t *testing.T) {
	deptest.Check(t, nil, deptest.Sockets)
}
