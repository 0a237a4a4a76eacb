package plan

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/deptest"
)

// TestDeps keeps plan a pure library: the standard library without sockets, and the pure
// packages whose decisions it composes.
func TestDeps(t *testing.T) {
	deptest.Check(t, []string{
		"github.com/kvmesh/kvmesh/admit", "github.com/kvmesh/kvmesh/admit/route", "github.com/kvmesh/kvmesh/carbon",
		"github.com/kvmesh/kvmesh/kvindex", "github.com/kvmesh/kvmesh/internal/jsonconf",
		"github.com/cespare/xxhash/v2", "golang.org/x/time/rate",
	}, deptest.Sockets)
}
