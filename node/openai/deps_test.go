package openai

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/deptest"
)

// TestDeps keeps openai to the standard library: wire types need nothing else.
func TestDeps(t *testing.T) {
	deptest.Check(t, nil, nil)
}
