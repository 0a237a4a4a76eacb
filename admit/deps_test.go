package admit

import (
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/internal/deptest"
)

// TestDeps keeps admit a pure library: the standard library without sockets, plus
// golang.org/x/time/rate, no cgo, and not admit/route (the node maps route's candidates into
// admit's options).
func TestDeps(t *testing.T) {
	forbidden := append(slices.Clone(deptest.Sockets), "github.com/kvmesh/kvmesh/admit/route")
	deptest.Check(t, []string{"golang.org/x/time/rate"}, forbidden)
}
