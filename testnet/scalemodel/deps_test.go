package scalemodel

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/deptest"
)

// TestDeps keeps the model a pure library: the standard library only.
func TestDeps(t *testing.T) {
	deptest.Check(t, nil, deptest.Sockets)
}
