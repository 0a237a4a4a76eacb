package route

import (
	"fmt"
	"slices"
	"testing"
)

func delegatePeers(names ...string) []Peer {
	out := make([]Peer, len(names))
	for i, n := range names {
		out[i] = Peer{Name: n, Models: []string{"b"}, Healthy: true}
	}
	return out
}

// TestDelegateFilters pins who may be a delegate: a healthy, fresh, reachable peer serving
// the model, never this node.
func TestDelegateFilters(t *testing.T) {
	tests := []struct {
		name string
		mod  func(p *Peer)
		want bool
	}{
		{"eligible", func(*Peer) {}, true},
		{"this node", func(p *Peer) { p.Self = true }, false},
		{"unhealthy", func(p *Peer) { p.Healthy = false }, false},
		{"stale", func(p *Peer) { p.Stale = true }, false},
		{"ejected", func(p *Peer) { p.Ejected = true }, false},
		{"another model", func(p *Peer) { p.Models = []string{"a"} }, false},
		{"loaded", func(p *Peer) { p.QueuedPrefillTokens, p.InFlightTokens = 1<<20, 1<<20 }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			peers := delegatePeers("n1")
			tt.mod(&peers[0])
			if got := Delegate(7, "b", peers) == 0; got != tt.want {
				t.Errorf("chosen %v, want %v", got, tt.want)
			}
		})
	}
	if got := Delegate(7, "b", nil); got != -1 {
		t.Errorf("no peers: %d, want -1", got)
	}
}

// TestDelegateIsRendezvous pins the hashing: a key's delegate does not depend on the order
// peers are listed in, keys spread evenly over idle members, a member leaving moves only its
// own keys, and a loaded member gets fewer keys.
func TestDelegateIsRendezvous(t *testing.T) {
	peers := delegatePeers("n1", "n2", "n3")
	rev := slices.Clone(peers)
	slices.Reverse(rev)
	const keys = 3000
	count := map[string]int{}
	chosen := make([]string, keys)
	for k := range keys {
		i, j := Delegate(uint64(k)*0x9e3779b97f4a7c15, "b", peers), Delegate(uint64(k)*0x9e3779b97f4a7c15, "b", rev)
		if peers[i].Name != rev[j].Name {
			t.Fatalf("key %d: %s in one order, %s in the other", k, peers[i].Name, rev[j].Name)
		}
		chosen[k] = peers[i].Name
		count[peers[i].Name]++
	}
	for _, p := range peers {
		if c := count[p.Name]; c < keys/4 || c > keys*5/12 {
			t.Errorf("%s got %d of %d keys, want about a third", p.Name, c, keys)
		}
	}
	without := peers[1:] // n1 leaves
	for k := range keys {
		got := without[Delegate(uint64(k)*0x9e3779b97f4a7c15, "b", without)].Name
		if chosen[k] != "n1" && got != chosen[k] {
			t.Fatalf("key %d moved from %s to %s when n1 left", k, chosen[k], got)
		}
	}
	peers[0].QueuedPrefillTokens = 3 * delegateLoadTokens // weight 1/4
	loaded := 0
	for k := range keys {
		if Delegate(uint64(k)*0x9e3779b97f4a7c15, "b", peers) == 0 {
			loaded++
		}
	}
	// Weighted rendezvous gives a member its weight's share: 0.25 / 2.25, about 11%.
	if loaded < keys/20 || loaded > keys/6 {
		t.Errorf("the loaded member got %d of %d keys, want about %d", loaded, keys, keys/9)
	}
}

// TestDelegateKey pins the key: a prompt's block at DelegateKeyBlocks (its last when
// shorter), the fallback for a prompt without a block.
func TestDelegateKey(t *testing.T) {
	blocks := make([]uint64, 40)
	for i := range blocks {
		blocks[i] = uint64(i + 1)
	}
	for _, tt := range []struct {
		blocks []uint64
		want   uint64
	}{
		{nil, 99},
		{blocks[:1], 1},
		{blocks[:10], 10},
		{blocks, DelegateKeyBlocks},
	} {
		t.Run(fmt.Sprint(len(tt.blocks)), func(t *testing.T) {
			if got := DelegateKey(tt.blocks, 99); got != tt.want {
				t.Errorf("DelegateKey = %d, want %d", got, tt.want)
			}
		})
	}
}
