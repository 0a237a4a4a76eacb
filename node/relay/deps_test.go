package relay

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/deptest"
)

// TestDeps keeps relay to the standard library and the wire types: the mesh's transport is
// the node's to use.
func TestDeps(t *testing.T) {
	deptest.Check(t, []string{"github.com/kvmesh/kvmesh/node/openai"}, nil)
}
