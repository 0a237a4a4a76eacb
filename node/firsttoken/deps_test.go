package firsttoken

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/deptest"
)

// TestDeps keeps firsttoken to the engine's interface: no transport, no gossip.
func TestDeps(t *testing.T) {
	deptest.Check(t, []string{"github.com/kvmesh/kvmesh/node/engine", "github.com/kvmesh/kvmesh/node/openai"}, nil)
}
