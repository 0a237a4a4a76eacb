package provider

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/deptest"
)

// TestDeps keeps provider to the standard library, net/http included, and package carbon: no
// os/exec, no plugins, no cgo files of its own.
func TestDeps(t *testing.T) {
	deptest.Check(t, []string{"github.com/kvmesh/kvmesh/carbon"}, []string{"os/exec", "plugin"})
}
