package node_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/node"
)

// TestExternalEngineMaxRunningIsConfigured: a node in front of an external engine advertises
// the EngineMaxRunning it is given as its engine's max_running, which no engine's metrics
// export, and the mesh sees that figure, not the engine package's default.
func TestExternalEngineMaxRunningIsConfigured(t *testing.T) {
	f := startRecordingEngine(t)
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		if i == 0 {
			cfg.Engine, cfg.EngineKind, cfg.EngineMaxRunning = f.url, "vllm", 32
			return
		}
		cfg.Models = []string{"another-model"}
	})
	for i := range tn.Nodes {
		poll.Until(t, 10*time.Second, fmt.Sprintf("n%d sees n1's engine run at most 32", i+1), func() bool {
			for _, m := range tn.Nodes[i].Members() {
				if m.Name == "n1" {
					return m.State.EngineHealthy && m.State.MaxRunning == 32
				}
			}
			return false
		})
	}
}
