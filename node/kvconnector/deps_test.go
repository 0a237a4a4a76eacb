package kvconnector

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/deptest"
)

// TestDeps keeps kvconnector to HTTP and the engine and wire types: no mesh, no admission.
func TestDeps(t *testing.T) {
	deptest.Check(t, []string{"github.com/kvmesh/kvmesh/node/engine", "github.com/kvmesh/kvmesh/node/openai"}, nil)
}
