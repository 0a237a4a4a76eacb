package agent

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/deptest"
)

// TestDeps keeps agent a pure library: the standard library only, without sockets or cgo.
func TestDeps(t *testing.T) {
	deptest.Check(t, nil, deptest.Sockets)
}
