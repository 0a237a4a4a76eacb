package lora

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/deptest"
)

// TestDeps keeps lora a pure library: the standard library without sockets, so that loading,
// its single flight and its evictions are tested without an engine.
func TestDeps(t *testing.T) {
	deptest.Check(t, nil, deptest.Sockets)
}
