package node_test

import (
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/node"
)

// TestReadyzSaysAJoinIsFailing: a node alone with a seed it cannot join (here down; a wrong
// gossip key is the same to it) stays ready, since a fleet restarting at once must serve, and
// says so in /readyz's body, in /v1/mesh/peers (kvmesh status) and in kvmesh_gossip_join_failing;
// a node without seeds says nothing of the kind.
func TestReadyzSaysAJoinIsFailing(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	_ = l.Close()
	for _, tt := range []struct {
		name    string
		join    []string
		failing bool
	}{
		{"seed down", []string{dead}, true},
		{"no seeds", nil, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tn := startNet(t, 1, func(_ int, cfg *node.Config) { cfg.Gossip.Join = tt.join })
			url := tn.URLs()[0]
			status, body := readyz(t, url)
			var rz struct{ Status, Warning string }
			if err := json.Unmarshal([]byte(body), &rz); err != nil || status != http.StatusOK || rz.Status != "ready" {
				t.Fatalf("/readyz: %d %s (%v), want 200 ready", status, body, err)
			}
			if got := strings.Contains(rz.Warning, "cannot join the seeds"); got != tt.failing {
				t.Errorf("/readyz warning %q, want one: %v", rz.Warning, tt.failing)
			}
			_, b := get(t, url+"/v1/mesh/peers")
			var pr node.PeersResponse
			if err := json.Unmarshal(b, &pr); err != nil {
				t.Fatal(err)
			}
			if got := pr.JoinFailing != ""; got != tt.failing {
				t.Errorf("/v1/mesh/peers join_failing %q, want one: %v", pr.JoinFailing, tt.failing)
			}
			want := "kvmesh_gossip_join_failing 0"
			if tt.failing {
				want = "kvmesh_gossip_join_failing 1"
			}
			if _, m := get(t, url+"/metrics"); !strings.Contains(string(m), want) {
				t.Errorf("/metrics lacks %q", want)
			}
		})
	}
}
