package node_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/node"
)

// BenchmarkOwnerDeathFailover measures how long requests for a prefix take to be served
// elsewhere once the node holding it dies abruptly (gossip silent, transport closed, no drain),
// gossip still listing it: the time from the death to the first request that completes on a
// live node, and how many requests sent in between failed. One request at a time goes to an
// ingress that routes the prefix to the dead owner. "now" runs the defaults (ejection after 2
// transport failures, 500 ms handshakes), "handshake-1s" the same with --handshake-timeout 1s;
// "before" turns ejection off and waits out quic-go's 5 s handshakes, as a node did before
// either existed.
//
//	go test -run '^$' -bench OwnerDeathFailover -benchtime 1x ./node/
func BenchmarkOwnerDeathFailover(b *testing.B) {
	for _, mode := range []struct {
		name      string
		handshake time.Duration
		eject     int
	}{{"now", 0, 0}, {"handshake-1s", time.Second, 0}, {"before", 5 * time.Second, -1}} {
		b.Run(mode.name, func(b *testing.B) {
			var served, failed, slowest time.Duration
			for range b.N {
				took, fails := ownerDeathFailover(b, mode.handshake, mode.eject)
				served += took
				failed += time.Duration(fails)
				slowest = max(slowest, took)
			}
			b.ReportMetric(float64(served.Milliseconds())/float64(b.N), "ms-to-served")
			b.ReportMetric(float64(failed)/float64(b.N), "failed-requests")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// ownerDeathFailover kills the owner of a placed prefix and sends requests for it, one after
// another, until one completes on a live node: it returns the time from the death to that
// completion and how many ended otherwise first.
func ownerDeathFailover(b *testing.B, handshake time.Duration, eject int) (time.Duration, int) {
	c := newCutter()
	tn := startNet(b, 3, func(i int, cfg *node.Config) {
		c.configure(i, cfg)
		cfg.HandshakeTimeout = handshake // configure's 300 ms is the tests'; 0 is the default
		cfg.Route.Eject.Failures = eject
	})
	c.learn(tn)
	prefix := longPrompt("failover", 2000)
	o, in := placePrefix(b, tn, chatBody(prefix, 2, false))
	owner, url := tn.Nodes[o].Name(), tn.URLs()[in]
	c.kill(b, tn, o)
	dead := time.Now()
	fails := 0
	for i := 0; ; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), chaosTimeout)
		e := send(ctx, request{url, chatBody(prefix+fmt.Sprint(" after ", i), 2, false)}, nil)
		cancel()
		if e.done && e.node != owner {
			return time.Since(dead), fails
		}
		fails++
		if time.Since(dead) > chaosTimeout {
			b.Fatalf("no request served within %v of the owner's death; last %v", chaosTimeout, e)
		}
	}
}
