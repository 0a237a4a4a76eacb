package node_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/transport"
)

// TestFailedOwnersEndWithA502 pins that a request whose only owner fails before the first
// token ends at once with a 502 carrying the failure's code, instead of going back to the
// waiting room until its queue TTL (a 429 queue_ttl_expired after it, before this was fixed):
// an owner whose engine answers 500 gives engine_error, an owner that cannot be reached
// owner_unreachable. Both count as failed at the ingress.
func TestFailedOwnersEndWithA502(t *testing.T) {
	f := newFakeEngine(t, "ext")
	f.answer(http.StatusInternalServerError, `{"error":{"message":"CUDA out of memory","code":"oom"}}`)
	tn := startNet(t, 3, func(i int, cfg *node.Config) {
		switch i {
		case 0:
			cfg.Models = []string{"another-model"} // an ingress only: forwards every request
			cfg.HandshakeTimeout = 300 * time.Millisecond
		case 1:
			f.external(cfg) // the only node serving "ext"; n3 is the only one serving model
		}
	})
	if err := tn.Nodes[2].KillTransport(); err != nil {
		t.Fatal(err)
	}
	url := tn.URLs()[0]
	tests := []struct{ name, body, code string }{
		{"engine failing", strings.Replace(chatBody("hello", 4, false), model, "ext", 1), "engine_error"},
		{"owner unreachable", chatBody("hello", 4, false), node.CodeOwnerUnreachable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Before the fix these waited out the TTL; 3 s keeps the old failure short.
			resp := post(t, url, "/v1/chat/completions", tt.body, map[string]string{node.HeaderQueueTTL: "3s"})
			b := readAll(t, resp)
			if e := decodeError(t, b).Error; resp.StatusCode != http.StatusBadGateway || e.Code != tt.code || resp.Header.Get(node.HeaderReason) != tt.code {
				t.Fatalf("%d %s, want 502 %s", resp.StatusCode, b, tt.code)
			}
			if got := metric(t, url, "kvmesh_requests_failed_total", `code="`+tt.code+`"`); got != 1 {
				t.Errorf("failed{code=%q} = %v, want 1", tt.code, got)
			}
		})
	}
	assertReconciled(t, url, 2)
}

// TestOwnerEngineOverloadTriesTheNextCandidate pins that an owner whose external engine
// answers 429 (its own overload) counts as the owner refusing: the ingress moves on to the
// next candidate, and the client never sees the engine's 429 while another candidate takes the
// request. Round-robin routing at the ingress sends the first request to the overloaded owner
// first and the second to the healthy one first.
func TestOwnerEngineOverloadTriesTheNextCandidate(t *testing.T) {
	f := newFakeEngine(t, model)
	f.answer(http.StatusTooManyRequests, `{"error":{"message":"too many requests","code":null}}`)
	tn := startNet(t, 3, func(i int, cfg *node.Config) {
		switch i {
		case 0:
			cfg.Models = []string{"another-model"}
			cfg.Policy = route.PolicyRoundRobin
		case 1:
			f.external(cfg)
		}
	})
	url := tn.URLs()[0]
	for i := range 2 {
		resp := post(t, url, "/v1/chat/completions", chatBody("hello", 4, false), nil)
		if b := readAll(t, resp); resp.StatusCode != http.StatusOK || resp.Header.Get(node.HeaderNode) != "n3" {
			t.Fatalf("request %d: %d on %q: %s; want 200 on n3", i, resp.StatusCode, resp.Header.Get(node.HeaderNode), b)
		}
	}
	if got := metric(t, url, "kvmesh_forward_attempts_total", `result="refused"`); got != 1 {
		t.Errorf("refused forwards = %v, want 1 (the overloaded owner, once)", got)
	}
	assertReconciled(t, url, 2)
}

// TestLocalEngineOverloadTriesTheNextCandidate pins that a node whose own external engine
// answers 429 to a request it runs itself counts as refusing it, as an owner whose engine
// answers a forward with 429 does: the request moves on to the other node, and the client
// never sees the engine's 429 while another candidate takes it. Round-robin routing at the
// ingress, the overloaded node, tries itself first for one of the two requests, streamed or
// not.
func TestLocalEngineOverloadTriesTheNextCandidate(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "unstreamed", true: "streamed"}[stream], func(t *testing.T) {
			f := newFakeEngine(t, model)
			f.answer(http.StatusTooManyRequests, `{"error":{"message":"too many requests","code":null}}`)
			tn := startNet(t, 2, func(i int, cfg *node.Config) {
				if i == 0 {
					f.external(cfg)
					cfg.Policy = route.PolicyRoundRobin
				}
			})
			url := tn.URLs()[0]
			for i := range 2 {
				resp := post(t, url, "/v1/chat/completions", chatBody("hello", 4, stream), nil)
				if b := readAll(t, resp); resp.StatusCode != http.StatusOK || resp.Header.Get(node.HeaderNode) != "n2" {
					t.Fatalf("request %d: %d on %q: %s; want 200 on n2", i, resp.StatusCode, resp.Header.Get(node.HeaderNode), b)
				}
			}
			assertReconciled(t, url, 2)
		})
	}
}

// TestRetryBudgetEndsAFailedRequest pins the retry budget: with no room left in it, a
// request whose first owner's engine fails ends with that failure (502 engine_error) instead
// of trying the next candidate, and kvmesh_forward_retries_total counts the refusal. The
// request that meets the healthy owner first is served as usual.
func TestRetryBudgetEndsAFailedRequest(t *testing.T) {
	f := newFakeEngine(t, model)
	f.answer(http.StatusInternalServerError, `{"error":{"message":"CUDA out of memory","code":"oom"}}`)
	tn := startNet(t, 3, func(i int, cfg *node.Config) {
		switch i {
		case 0:
			cfg.Models = []string{"another-model"}
			cfg.Policy = route.PolicyRoundRobin
			// No floor, and a share no handful of requests reaches: no retry at all.
			cfg.Route.RetryBudget = route.RetryBudgetConfig{Ratio: 0.01, MinRetries: -1}
		case 1:
			f.external(cfg)
		}
	})
	url := tn.URLs()[0]
	want := []struct {
		status int
		code   string
	}{{http.StatusBadGateway, "engine_error"}, {http.StatusOK, ""}}
	for i, w := range want {
		resp := post(t, url, "/v1/chat/completions", chatBody("hello", 4, false), nil)
		b := readAll(t, resp)
		if resp.StatusCode != w.status || resp.Header.Get(node.HeaderReason) != w.code {
			t.Fatalf("request %d: %d (%s %q) %s, want %d %q", i, resp.StatusCode, node.HeaderReason, resp.Header.Get(node.HeaderReason), b, w.status, w.code)
		}
	}
	for result, n := range map[string]float64{"budget_exhausted": 1, "allowed": 0} {
		if got := metric(t, url, "kvmesh_forward_retries_total", `result="`+result+`"`); got != n {
			t.Errorf("retries{result=%q} = %v, want %v", result, got, n)
		}
	}
	assertReconciled(t, url, 2)
}

// TestHandshakeTimeoutBoundsADialToADeadPeer pins --handshake-timeout: a forward to an address
// where nothing answers gives up as unreachable, for a timeout, after the configured 200 ms,
// well inside a deadline (4 s) shorter than quic-go's own 5 s default.
func TestHandshakeTimeoutBoundsADialToADeadPeer(t *testing.T) {
	tn := startNet(t, 1, func(i int, cfg *node.Config) { cfg.HandshakeTimeout = 200 * time.Millisecond })
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := c.LocalAddr().String()
	_ = c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	err = tn.Nodes[0].Dial(ctx, dead)
	if ctx.Err() != nil || !errors.Is(err, transport.ErrUnreachable) || transport.FailureReason(err) != transport.FailTimeout {
		t.Fatalf("dial to a dead address: %v (deadline passed: %v); want unreachable by handshake timeout", err, ctx.Err() != nil)
	}
}
