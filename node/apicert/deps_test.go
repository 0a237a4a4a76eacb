package apicert

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/deptest"
)

// TestDeps keeps apicert to the standard library.
func TestDeps(t *testing.T) {
	deptest.Check(t, nil, nil)
}
