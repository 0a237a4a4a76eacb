package node

import (
	"slices"
	"testing"
)

// TestReleaseDemotesOnlyWhatNoActiveAgentShares pins which blocks of a prefix the window gives
// up go first to eviction: those no active agent's prefix holds (a system prompt every agent
// shares stays), and none without an engine that can demote.
func TestReleaseDemotesOnlyWhatNoActiveAgentShares(t *testing.T) {
	tests := []struct {
		name     string
		active   map[string][]uint64
		released []uint64
		want     []uint64 // nil: no call
	}{
		{"no active agent", nil, []uint64{1, 2, 3}, []uint64{1, 2, 3}},
		{"shared head kept", map[string][]uint64{"b": {1, 2, 7, 8}}, []uint64{1, 2, 3, 4}, []uint64{3, 4}},
		{"all shared", map[string][]uint64{"b": {1, 2}, "c": {3}}, []uint64{1, 2, 3}, nil},
		{"nothing to release", map[string][]uint64{"b": {1}}, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []uint64
			calls := 0
			g := &agentGate{prefix: tt.active, demote: func(bs []uint64) int {
				calls++
				got = append(got, bs...)
				return len(bs)
			}}
			g.releaseLocked(tt.released)
			if tt.want == nil {
				if calls != 0 {
					t.Fatalf("demoted %v, want no call", got)
				}
				return
			}
			if calls != 1 || !slices.Equal(got, tt.want) {
				t.Fatalf("demoted %v in %d calls, want %v in one", got, calls, tt.want)
			}
		})
	}
	g := &agentGate{prefix: map[string][]uint64{}} // an external engine: no demote
	g.releaseLocked([]uint64{1})
}
