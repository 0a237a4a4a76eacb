package route

import (
	"fmt"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// idle returns a fresh, healthy, idle peer serving model "m".
func idle(name string) Peer {
	return Peer{
		Name:                   name,
		Models:                 []string{"m"},
		Age:                    100 * time.Millisecond,
		Healthy:                true,
		Vendor:                 "nvidia",
		VRAMTotalBytes:         80 << 30,
		KVBlocksTotal:          1000,
		MaxRunning:             256,
		PrefillTokensPerSecond: 20000,
		DecodeStepSeconds:      0.02,
		PowerWatts:             300,
		PowerCapWatts:          700,
		TempC:                  50,
	}
}

func idlePeers(n int) []Peer {
	ps := make([]Peer, n)
	for i := range ps {
		ps[i] = idle(fmt.Sprintf("n%d", i))
	}
	return ps
}

func newRouter(t testing.TB, mod func(*Config)) *Router {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Seed = 1
	if mod != nil {
		mod(&cfg)
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return r
}

func req(prompt int) Request {
	return Request{Model: "m", PromptTokens: prompt, MaxTokens: 128, BlockTokens: 16}
}

func mustRoute(t *testing.T, p Policy, now time.Time, rq Request, peers []Peer) []Candidate {
	t.Helper()
	c, err := p.Route(now, rq, peers, nil)
	if err != nil {
		t.Fatalf("Route: %v", err)
	}
	if len(c) == 0 {
		t.Fatal("Route returned no candidates and no error")
	}
	return c
}

func names(cs []Candidate) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.Name
	}
	return out
}
