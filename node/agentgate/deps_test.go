package agentgate

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/deptest"
)

// TestDeps keeps agentgate to agent admission and the standard library: no transport, no
// gossip, no metrics library.
func TestDeps(t *testing.T) {
	deptest.Check(t, []string{"github.com/kvmesh/kvmesh/admit/agent"}, nil)
}
