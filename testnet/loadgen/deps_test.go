package loadgen

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/deptest"
)

// TestDeps keeps loadgen to the standard library and node/openai: it drives any
// OpenAI-compatible endpoint and must not depend on the node.
func TestDeps(t *testing.T) {
	deptest.Check(t, []string{"github.com/kvmesh/kvmesh/node/openai"}, nil)
}
