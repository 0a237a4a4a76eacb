package render

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/deptest"
)

// TestDeps keeps render to the wire and engine types: it builds values and writes nothing.
func TestDeps(t *testing.T) {
	deptest.Check(t, []string{"github.com/kvmesh/kvmesh/node/engine", "github.com/kvmesh/kvmesh/node/openai"}, nil)
}
