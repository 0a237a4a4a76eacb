package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/testnet"
)

// TestTestnetTableListsGossipAddresses: kvmesh testnet's table gives each node's API URL,
// role and gossip address, one line a node.
func TestTestnetTableListsGossipAddresses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tn, err := testnet.Start(ctx, testnet.Config{Nodes: 2, Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tn.Close() })
	var out bytes.Buffer
	printNodes(&out, tn, []string{"prefill"})
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	gossip := tn.GossipAddrs()
	if len(lines) != 2 {
		t.Fatalf("table:\n%s\nwant 2 lines", out.String())
	}
	for i, line := range lines {
		want := testnet.Name(i) + "  " + tn.URLs()[i]
		if i == 0 {
			want += "  prefill"
		}
		if want += "  gossip " + gossip[i]; line != want || gossip[i] == "" {
			t.Errorf("line %d %q, want %q", i, line, want)
		}
	}
}
