package scalemodel_test

import (
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/testnet/scalemodel"
)

// TestMeshIntervalMatchesGossip keeps the model's copy of gossip.MeshInterval (the model
// imports no sockets, so it cannot call it) from drifting.
func TestMeshIntervalMatchesGossip(t *testing.T) {
	for _, every := range []time.Duration{time.Second, 5 * time.Second} {
		for _, n := range []int{0, 1, 16, 32, 64, 128, 150, 256, 512, 1000, 5000} {
			if got, want := scalemodel.MeshInterval(every, n), gossip.MeshInterval(every, n); got != want {
				t.Errorf("MeshInterval(%v, %d) = %v, gossip's %v", every, n, got, want)
			}
		}
	}
}
