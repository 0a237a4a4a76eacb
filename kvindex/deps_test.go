package kvindex

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/deptest"
)

// TestDeps keeps kvindex a pure library: the standard library and xxhash, no sockets, no cgo.
func TestDeps(t *testing.T) {
	deptest.Check(t, []string{"github.com/cespare/xxhash/v2"}, deptest.Sockets)
}
