package testnet_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/testnet"
)

// freeBase returns a port p such that p and p+1 are free for TCP and UDP on loopback, as far
// as can be told before they are bound.
func freeBase(t *testing.T) int {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if p < 65535 && portFree(p) && portFree(p+1) {
			return p
		}
	}
	t.Fatal("no two consecutive free ports")
	return 0
}

func portFree(p int) bool {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	defer l.Close()
	u, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	return u.Close() == nil
}

// TestGossipBaseSetsThePorts: with GossipBase, node i gossips on GossipBase+i, and
// GossipAddrs says so.
func TestGossipBaseSetsThePorts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var tn *testnet.Net
	var base int
	for range 3 { // another process may take a port between freeBase and the bind
		base = freeBase(t)
		var err error
		if tn, err = testnet.Start(ctx, testnet.Config{Nodes: 2, Fast: true, GossipBase: base}); err == nil {
			break
		} else if !strings.Contains(err.Error(), "address already in use") {
			t.Fatal(err)
		}
	}
	if tn == nil {
		t.Fatal("the gossip ports stayed taken")
	}
	t.Cleanup(func() { _ = tn.Close() })
	for i, addr := range tn.GossipAddrs() {
		if want := net.JoinHostPort("127.0.0.1", strconv.Itoa(base+i)); addr != want {
			t.Errorf("node %d gossips on %s, want %s", i, addr, want)
		}
	}
	if err := tn.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestBadBasePortsAreRefused: a negative base port, or one whose nodes' ports do not fit, is
// an error naming it, before anything starts.
func TestBadBasePortsAreRefused(t *testing.T) {
	for _, cfg := range []testnet.Config{
		{Nodes: 2, GossipBase: -1},
		{Nodes: 2, GossipBase: 65535},
		{Nodes: 2, HTTPBase: -5},
	} {
		_, err := testnet.Start(context.Background(), cfg)
		if err == nil || !strings.Contains(err.Error(), "base port") {
			t.Errorf("%+v: error %v, want one about the base port", cfg, err)
		}
	}
}
