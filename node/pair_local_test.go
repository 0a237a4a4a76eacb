package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet"
)

// localPrefill is roles with route.decode_local_prefill on, as it is by default.
func localPrefill(rs ...string) func(i int, cfg *node.Config) {
	return func(i int, cfg *node.Config) {
		roles(rs...)(i, cfg)
		cfg.Route.DecodeLocalPrefill = nil
	}
}

// TestDecodeNodePrefillsLocally pins conditional disaggregation end to end on a prefill node
// and a decode node: a short prompt, from either node as the ingress, runs whole on the decode
// node (whole_decode_short), and so does a long one whose TTFT target the slow prefill node
// would miss (whole_prefill_behind). The client reads what a mixed node writes, the prefill
// node's engine runs nothing, the responses name no prefill node (HeaderPrefillNode), the
// requests count in the whole pool only, and every request received is completed, refused or
// failed.
func TestDecodeNodePrefillsLocally(t *testing.T) {
	short, long := longPrompt("local", 600), longPrompt("behind", 4000)
	ref := mixedAnswers(t, chatBody(short, 40, true), chatBody(long, 16, false))
	want := readStream(t, []byte(ref[0]))
	var wantLong whole
	if err := json.Unmarshal([]byte(ref[1]), &wantLong); err != nil {
		t.Fatal(err)
	}
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		localPrefill("prefill", "decode")(i, cfg)
		if i == 0 {
			// About 6,600 prompt tokens a second against the decode node's 620,000: the pair
			// predicts some 600 ms for the long prompt, the decode node alone 7 ms.
			cfg.Sim.StepPerToken = 3 * time.Millisecond
		}
	})
	urls := tn.URLs()

	for i, url := range urls {
		resp := post(t, url, "/v1/chat/completions", chatBody(short, 40, true), nil)
		b := readAll(t, resp)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(node.HeaderNode) != "n2" {
			t.Fatalf("n%d: %d from %q: %s, want 200 from the decode node n2", i+1, resp.StatusCode, resp.Header.Get(node.HeaderNode), b)
		}
		if got := resp.Header.Values(node.HeaderPrefillNode); len(got) != 0 {
			t.Errorf("n%d: run whole on the decode node, yet %s %q", i+1, node.HeaderPrefillNode, got)
		}
		got := readStream(t, b)
		if got.text != want.text || got.roles != 1 || len(got.finish) != 1 || got.finish[0] != want.finish[0] || !got.done || got.errored ||
			got.usage.PromptTokens != want.usage.PromptTokens || got.usage.CompletionTokens != want.usage.CompletionTokens {
			t.Errorf("n%d: %q, %d role chunks, finish %v, usage %+v; want %q, one, %v, %+v",
				i+1, got.text, got.roles, got.finish, got.usage, want.text, want.finish, want.usage)
		}
		if n := metric(t, url, "kvmesh_route_disaggregated_total", `outcome="whole_decode_short"`); n != 1 {
			t.Errorf("n%d: whole_decode_short = %v, want 1", i+1, n)
		}
	}

	resp := post(t, urls[0], "/v1/chat/completions", chatBody(long, 16, false), map[string]string{node.HeaderTTFTSLO: "200ms"})
	b := readAll(t, resp)
	var w whole
	if resp.StatusCode != http.StatusOK || resp.Header.Get(node.HeaderNode) != "n2" || json.Unmarshal(b, &w) != nil || len(w.Choices) != 1 {
		t.Fatalf("long prompt: %d from %q: %s, want 200 from n2", resp.StatusCode, resp.Header.Get(node.HeaderNode), b)
	}
	if got := resp.Header.Values(node.HeaderPrefillNode); len(got) != 0 {
		t.Errorf("long prompt: run whole on the decode node, yet %s %q", node.HeaderPrefillNode, got)
	}
	if w.Choices[0].Message.Content != wantLong.Choices[0].Message.Content || w.Usage.PromptTokens != wantLong.Usage.PromptTokens ||
		w.Usage.CompletionTokens != wantLong.Usage.CompletionTokens {
		t.Errorf("long prompt: %s, want %s", b, ref[1])
	}
	if n := metric(t, urls[0], "kvmesh_route_disaggregated_total", `outcome="whole_prefill_behind"`); n != 1 {
		t.Errorf("whole_prefill_behind = %v, want 1", n)
	}

	for i, url := range urls {
		for _, o := range []string{`outcome="split"`, `outcome="handover"`} {
			if n := metric(t, url, "kvmesh_route_disaggregated_total", o); n != 0 {
				t.Errorf("n%d: %s = %v, want 0", i+1, o, n)
			}
		}
		for _, pool := range []string{`pool="prefill"`, `pool="decode"`} {
			if n := metric(t, url, "kvmesh_admission_pool_decisions_total", pool); n != 0 {
				t.Errorf("n%d: %s decisions %v, want 0", i+1, pool, n)
			}
		}
	}
	if n := metric(t, urls[0], "kvmesh_engine_requests_total", ""); n != 0 {
		t.Errorf("the prefill node's engine ran %v requests, want 0", n)
	}
	// The decode node admitted its own request and, as the owner, the prefill node's two.
	if n := metric(t, urls[1], "kvmesh_admission_pool_decisions_total", `decision="accept",pool="whole"`); n != 3 {
		t.Errorf("the decode node's whole pool accepted %v, want 3", n)
	}
	assertReconciled(t, urls[0], 2)
	assertReconciled(t, urls[1], 1)
}

// TestDecodeNodeRunsWholeRequestsByItsSetting pins the owner's side: a decode node refuses a
// forwarded whole request 503 wrong_role with its route.decode_local_prefill off, and runs it
// on its engine with it on, admitted at the whole request's KV mark (queue_on, 0.95), not the
// decode pool's (decode_queue_on, 0.9): its KV held at 91% takes it.
func TestDecodeNodeRunsWholeRequestsByItsSetting(t *testing.T) {
	body := chatBody(longPrompt("owner", 600), 40, false)
	ref := mixedAnswers(t, body)
	tn := startNet(t, 3, func(i int, cfg *node.Config) {
		roles("prefill", "decode", "decode")(i, cfg)
		if i == 2 {
			cfg.Route.DecodeLocalPrefill = nil
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ingress := tn.Nodes[0]

	status, _, code, err := ingress.ForwardWhole(ctx, "n2", body)
	if err != nil || status != http.StatusServiceUnavailable || code != node.CodeWrongRole {
		t.Errorf("off: %d %q %v, want 503 %s", status, code, err, node.CodeWrongRole)
	}

	tn.Nodes[2].HoldKV(3720, false) // 3,720 + about 45 of 4,096 blocks: 92%
	status, b, code, err := ingress.ForwardWhole(ctx, "n3", body)
	if err != nil || status != http.StatusOK {
		t.Fatalf("on: %d %q %v: %s, want 200", status, code, err, b)
	}
	var got, want whole
	if json.Unmarshal(b, &got) != nil || json.Unmarshal([]byte(ref[0]), &want) != nil || len(got.Choices) != 1 ||
		got.Choices[0].Message.Content != want.Choices[0].Message.Content || got.Usage != want.Usage {
		t.Errorf("on: %s, want %s", b, ref[0])
	}
	url := tn.URLs()[2]
	if n := metric(t, url, "kvmesh_admission_pool_decisions_total", `decision="accept",pool="whole"`); n != 1 {
		t.Errorf("whole pool accepts %v, want 1", n)
	}
	if n := metric(t, url, "kvmesh_engine_requests_total", `origin="peer"`); n != 1 {
		t.Errorf("the decode node's engine ran %v requests, want 1", n)
	}
}

// TestExternalDecodeNodePrefillsLocally pins a decode node in front of an external engine (a
// kvmesh engine in the decode role, as a vLLM decode server) running a short prompt whole: the
// engine gets the request without kv_transfer_params and answers it as a mixed node does.
func TestExternalDecodeNodePrefillsLocally(t *testing.T) {
	body := chatBody(longPrompt("external", 600), 40, false)
	ref := mixedAnswers(t, body)
	tn := startNet(t, 2, localPrefill("prefill", "decode"), testnet.EnginesExternal)
	url := tn.URLs()[0]
	resp := post(t, url, "/v1/chat/completions", body, nil)
	b := readAll(t, resp)
	var got, want whole
	if resp.StatusCode != http.StatusOK || resp.Header.Get(node.HeaderNode) != "n2" || json.Unmarshal(b, &got) != nil ||
		json.Unmarshal([]byte(ref[0]), &want) != nil || len(got.Choices) != 1 || got.Choices[0].Message.Content != want.Choices[0].Message.Content {
		t.Fatalf("%d from %q: %s, want %s from n2", resp.StatusCode, resp.Header.Get(node.HeaderNode), b, ref[0])
	}
	if n := metric(t, url, "kvmesh_route_disaggregated_total", `outcome="whole_decode_short"`); n != 1 {
		t.Errorf("whole_decode_short = %v, want 1", n)
	}
	if n := metric(t, url, "kvmesh_engine_requests_total", ""); n != 0 {
		t.Errorf("the prefill node's engine ran %v requests, want 0", n)
	}
	assertReconciled(t, url, 1)
}

// TestIngressLearnsDecodeNodeRunsHalvesOnly pins a decode node's own route.decode_local_prefill
// reaching the ingresses through its state record: with it off there (on at the ingress), a
// short prompt is split on the pair at once, never offered to the decode node whole (no
// wrong_role round trip, no refused forward); the record and /v1/mesh/peers say halves_only.
func TestIngressLearnsDecodeNodeRunsHalvesOnly(t *testing.T) {
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		localPrefill("prefill", "decode")(i, cfg)
		if i == 1 {
			cfg.Route.DecodeLocalPrefill = new(bool)
		}
	})
	url := tn.URLs()[0]
	var peer node.PeerInfo
	for _, p := range peers(t, url).Peers {
		if p.Name == "n2" {
			peer = p
		}
	}
	if peer.Role != "decode" || !peer.HalvesOnly {
		t.Fatalf("the ingress's view of n2: role %q, halves_only %v; want decode, true", peer.Role, peer.HalvesOnly)
	}
	for i := range 2 {
		resp := post(t, url, "/v1/chat/completions", chatBody(longPrompt(fmt.Sprint("halves", i), 600), 16, false), nil)
		if b := readAll(t, resp); resp.StatusCode != http.StatusOK || resp.Header.Get(node.HeaderNode) != "n2" {
			t.Fatalf("request %d: %d from %q: %s, want 200 from n2", i, resp.StatusCode, resp.Header.Get(node.HeaderNode), b)
		}
	}
	for o, want := range map[string]float64{"split": 2, "handover": 2, "whole_decode_short": 0} {
		if n := metric(t, url, "kvmesh_route_disaggregated_total", `outcome="`+o+`"`); n != want {
			t.Errorf("%s = %v, want %v", o, n, want)
		}
	}
	if n := metric(t, url, "kvmesh_forward_attempts_total", `result="refused"`); n != 0 {
		t.Errorf("%v forwards refused, want none", n)
	}
	assertReconciled(t, url, 2)
}
