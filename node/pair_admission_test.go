package node_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/node"
)

// until polls cond every few milliseconds until it holds, failing the test at the deadline.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, with a deadline
	}
}

// TestDecodeFullRefusedBeforePrefill pins admission per role end to end: with the decode node's
// KV full by its record and not draining in time, a split request is refused 429 decode_full,
// saying why and when to retry, before any prefill runs; one whose target allows the wait
// queues, and runs once the decode node reports room.
func TestDecodeFullRefusedBeforePrefill(t *testing.T) {
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		roles("prefill", "decode")(i, cfg)
		cfg.Sim.TimeScale = 1 // decode residences of seconds, so a full node drains slowly
	})
	url := tn.URLs()[0] // the prefill node is the ingress
	tn.Nodes[1].HoldKV(4096, true)
	until(t, "the ingress to see the decode node full", func() bool { return tn.Nodes[0].PeerKVUsed("n2") >= 4096 })

	body := chatBody(longPrompt("full", 3000), 1000, false)
	resp := post(t, url, "/v1/chat/completions", body, map[string]string{node.HeaderTTFTSLO: "500ms"})
	b := readAll(t, resp)
	e := decodeError(t, b).Error
	if resp.StatusCode != http.StatusTooManyRequests || e.Code != "decode_full" || resp.Header.Get("Retry-After") == "" ||
		!strings.Contains(e.Message, "decode node n2") {
		t.Fatalf("%d %s (Retry-After %q), want 429 decode_full naming n2", resp.StatusCode, b, resp.Header.Get("Retry-After"))
	}
	if got := metric(t, url, "kvmesh_engine_requests_total", ""); got != 0 {
		t.Errorf("the prefill node ran %v requests before the refusal, want 0", got)
	}
	if got := metric(t, url, "kvmesh_admission_pool_decisions_total", `decision="refuse",pool="decode"`); got != 1 {
		t.Errorf("decode pool refusals %v, want 1", got)
	}

	// With the default target the decode room can come in time (a 300-token residence drains
	// the missing blocks in about 0.1 s): the request waits for it.
	done := make(chan int, 1)
	go func() {
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(longPrompt("wait", 3000), 300, false)))
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	until(t, "the request to wait for decode room", func() bool {
		return metric(t, url, "kvmesh_admission_pool_decisions_total", `decision="queue",pool="decode"`) == 1
	})
	if got := metric(t, url, "kvmesh_engine_requests_total", ""); got != 0 {
		t.Errorf("the prefill node ran %v requests while the decode node was full, want 0", got)
	}
	tn.Nodes[1].HoldKV(0, true)
	if code := <-done; code != http.StatusOK {
		t.Fatalf("queued request: %d, want 200 once the decode node has room", code)
	}
	for pool, want := range map[string]float64{"prefill": 1, "decode": 1} {
		if got := metric(t, url, "kvmesh_admission_pool_decisions_total", `decision="accept",pool="`+pool+`"`); got != want {
			t.Errorf("%s pool accepts %v, want %v", pool, got, want)
		}
	}
	assertReconciled(t, url, 2)
}

// TestDecodeNodeRefusesHandover pins the handover queue: decode nodes whose room changed while
// the prompt prefilled (their records still show room; their own checks do not) refuse the
// handover, and the ingress waits for decode room rather than lose the prefill: until its
// deadline, then 503 decode_unavailable; or until a decode node has room, which serves it.
func TestDecodeNodeRefusesHandover(t *testing.T) {
	tn := startNet(t, 3, roles("prefill", "decode", "decode"))
	url := tn.URLs()[0]
	for _, d := range tn.Nodes[1:] {
		d.HoldKV(4096, false)
	}

	start := time.Now()
	resp := post(t, url, "/v1/chat/completions", chatBody(longPrompt("never", 3000), 8, false), map[string]string{node.HeaderQueueTTL: "1s"})
	b := readAll(t, resp)
	if e := decodeError(t, b).Error; resp.StatusCode != http.StatusServiceUnavailable || e.Code != node.CodeDecodeUnavailable ||
		!strings.Contains(e.Message, "deadline") {
		t.Fatalf("%d %s, want 503 %s after the wait", resp.StatusCode, b, node.CodeDecodeUnavailable)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the handover waited %v past a 1 s queue TTL", d)
	}
	if got := metric(t, url, "kvmesh_route_disaggregated_total", `outcome="handover_queued"`); got != 1 {
		t.Errorf("handover_queued = %v, want 1", got)
	}

	body := chatBody(longPrompt("later", 3000), 8, true)
	type answer struct {
		status int
		body   []byte
	}
	done := make(chan answer, 1)
	go func() {
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			done <- answer{}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		done <- answer{resp.StatusCode, b}
	}()
	until(t, "the second handover to wait", func() bool {
		return metric(t, url, "kvmesh_route_disaggregated_total", `outcome="handover_queued"`) == 2
	})
	tn.Nodes[2].HoldKV(0, false) // n3 has room again
	a := <-done
	if a.status != http.StatusOK {
		t.Fatalf("after the decode node freed room: %d %s", a.status, a.body)
	}
	if got := readStream(t, a.body); got.errored || !got.done || got.roles != 1 || got.text == "" {
		t.Fatalf("after the decode node freed room: %+v", got)
	}
	if got := metric(t, url, "kvmesh_route_disaggregated_total", `outcome="decode_retried"`); got < 2 {
		t.Errorf("decode_retried = %v, want the handovers offered again", got)
	}
	assertReconciled(t, url, 2)
}
