package anthropic

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/deptest"
)

// TestDeps keeps anthropic to the standard library and kvmesh's OpenAI wire format: a
// translation needs nothing else.
func TestDeps(t *testing.T) {
	deptest.Check(t, []string{"github.com/kvmesh/kvmesh/node/openai"}, nil)
}
