package responseid

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/deptest"
)

// TestDeps keeps responseid to the standard library and its hash: it knows no node or engine.
func TestDeps(t *testing.T) {
	deptest.Check(t, []string{"github.com/cespare/xxhash/v2"}, nil)
}
