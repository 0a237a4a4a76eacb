package admit

import (
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/internal/deptest"
)

// TestDeps keeps admit a pure library: the standard library without sockets, plus
// golang.org/x/time/rate and internal/jsonconf (the config file reader), no cgo, and not
// admit/route (the node maps route's candidates into admit's options).
func TestDeps(t *testing.T) {
	forbidden := append(slices.Clone(deptest.Sockets), "github.com/kvmesh/kvmesh/admit/route")
	deptest.Check(t, []string{"golang.org/x/time/rate", "github.com/kvmesh/kvmesh/internal/jsonconf"}, forbidden)
}
