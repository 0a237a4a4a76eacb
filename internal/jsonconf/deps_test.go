package jsonconf

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/deptest"
)

// TestDeps keeps jsonconf to the standard library, without sockets, so the pure libraries
// can read their config files with it.
func TestDeps(t *testing.T) {
	deptest.Check(t, nil, deptest.Sockets)
}
