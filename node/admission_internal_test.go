package node

import (
	"context"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/node/engine"
)

// stateEngine is an engine that only reports a fixed state.
type stateEngine struct{ st engine.State }

func (e stateEngine) Generate(context.Context, *engine.Request) (engine.Stream, error) {
	return nil, engine.ErrUnavailable
}
func (e stateEngine) State() engine.State    { return e.st }
func (e stateEngine) Models() []engine.Model { return nil }

// TestOptionsCountTheEngineQueue: the KV admission offers a request is what is left after the
// engine's running and queued work (admit.Option.FreeKVBlocks). The engine's queue is first come
// first served and its head waits for blocks, so the blocks free now are not free for a request
// that will run behind 1,600 queued prefill tokens (100 blocks of 16).
func TestOptionsCountTheEngineQueue(t *testing.T) {
	tests := []struct {
		name          string
		used, queued  int
		reserved      int
		wantFree      int
		wantLocalFree int
	}{
		{"idle", 0, 0, 0, 1000, 1000},
		{"running work", 400, 0, 0, 600, 600},
		{"queued prefill", 400, 1600, 0, 500, 500},
		{"partial block rounds up", 400, 1601, 0, 499, 499},
		{"this node's reservations", 400, 1600, 50, 450, 500},
		{"never negative", 950, 1600, 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := engine.State{Healthy: true, BlockTokens: 16, KVBlocksTotal: 1000, KVBlocksUsed: tt.used,
				QueuedPrefillTokens: tt.queued, PrefillTokensPerSecond: 20000}
			n := &Node{eng: stateEngine{st}}
			n.cfg.Name = "self"
			v := &view{peers: []route.Peer{{Name: "p", KVBlocksTotal: st.KVBlocksTotal, KVBlocksUsed: tt.used,
				QueuedPrefillTokens: tt.queued}}}
			c := &route.Candidate{Peer: 0, Name: "p"}
			c.Terms.ReservedBlocks = tt.reserved
			if got := n.optionOf(time.Time{}, c, v).FreeKVBlocks; got != tt.wantFree {
				t.Errorf("optionOf free = %d, want %d", got, tt.wantFree)
			}
			if got := n.localOption().FreeKVBlocks; got != tt.wantLocalFree {
				t.Errorf("localOption free = %d, want %d", got, tt.wantLocalFree)
			}
		})
	}
}
