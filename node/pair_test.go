package node_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet"
)

// roles configures node i of a testnet with roles[i]. Its decode nodes run decode halves only
// (route.decode_local_prefill off), so that the tests' short prompts are split: localPrefill
// turns it back on.
func roles(rs ...string) func(i int, cfg *node.Config) {
	return func(i int, cfg *node.Config) {
		cfg.Role = rs[i]
		cfg.HandshakeTimeout = 300 * time.Millisecond
		cfg.Route.DecodeLocalPrefill = new(bool)
	}
}

// streamed is what a client read from a chat stream: its text, the opening role chunks, the
// finish reasons and the usage.
type streamed struct {
	text    string
	roles   int
	finish  []string
	usage   usage
	done    bool
	errored bool
}

func readStream(t *testing.T, body []byte) streamed {
	t.Helper()
	var s streamed
	events := sseEvents(t, body)
	for _, e := range events {
		if e == "[DONE]" {
			s.done = true
			continue
		}
		var c struct {
			Choices []struct {
				Delta struct {
					Role    string `json:"role"`
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Error *struct{} `json:"error"`
		}
		if err := json.Unmarshal([]byte(e), &c); err != nil {
			t.Fatalf("event %q: %v", e, err)
		}
		if c.Error != nil {
			s.errored = true
		}
		for _, ch := range c.Choices {
			if ch.Delta.Role != "" {
				s.roles++
			}
			s.text += ch.Delta.Content
			if ch.FinishReason != nil {
				s.finish = append(s.finish, *ch.FinishReason)
			}
		}
	}
	s.usage = streamUsage(t, events)
	return s
}

type whole struct {
	Choices []struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage usage `json:"usage"`
}

// mixedAnswers runs bodies on a lone mixed node: what a split request must answer.
func mixedAnswers(t *testing.T, bodies ...string) []string {
	t.Helper()
	url := startNet(t, 1, nil).URLs()[0]
	var out []string
	for _, b := range bodies {
		resp := post(t, url, "/v1/chat/completions", b, nil)
		out = append(out, string(readAll(t, resp)))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("reference: %d %s", resp.StatusCode, out[len(out)-1])
		}
	}
	return out
}

// TestSplitRequestStreams pins a request through a prefill node and a decode node, from
// every ingress (the prefill node itself, the decode node itself, and a node that is
// neither): the client reads one stream with one role chunk, the text a mixed node writes
// for the same request, one finish reason and the usage of the whole request; a request not
// streamed gets the same text in one response. The prefill half's handover never reaches it;
// both responses name the node that ran the prefill half (HeaderPrefillNode).
func TestSplitRequestStreams(t *testing.T) {
	splitStreams(t, startNet(t, 4, roles("prefill", "decode", "decode", "prefill")))
}

// splitStreams runs TestSplitRequestStreams' requests from every node of tn, a mesh of
// prefill and decode nodes.
func splitStreams(t *testing.T, tn *testnet.Net) {
	t.Helper()
	prompt := longPrompt("split", 600)
	streamBody, wholeBody := chatBody(prompt, 40, true), chatBody(prompt, 40, false)
	ref := mixedAnswers(t, streamBody, wholeBody)
	want := readStream(t, []byte(ref[0]))
	var wantWhole whole
	if err := json.Unmarshal([]byte(ref[1]), &wantWhole); err != nil {
		t.Fatal(err)
	}

	for i, url := range tn.URLs() {
		before := engineRuns(t, tn)
		resp := post(t, url, "/v1/chat/completions", streamBody, nil)
		b := readAll(t, resp)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("n%d: %d %s", i+1, resp.StatusCode, b)
		}
		checkPrefillNode(t, fmt.Sprintf("n%d", i+1), resp, before, engineRuns(t, tn))
		got := readStream(t, b)
		if got.text != want.text || got.roles != 1 || len(got.finish) != 1 || got.finish[0] != want.finish[0] ||
			!got.done || got.errored {
			t.Errorf("n%d: text %q, %d role chunks, finish %v, done %v; want %q, one role chunk, finish %v",
				i+1, got.text, got.roles, got.finish, got.done, want.text, want.finish)
		}
		if got.usage.PromptTokens != want.usage.PromptTokens || got.usage.CompletionTokens != want.usage.CompletionTokens {
			t.Errorf("n%d: usage %+v, want %+v", i+1, got.usage, want.usage)
		}
		if strings.Contains(string(b), "handover") || strings.Contains(string(b), "kv_transfer_params") {
			t.Errorf("n%d: the client read the handover: %s", i+1, b)
		}

		before = engineRuns(t, tn)
		resp = post(t, url, "/v1/chat/completions", wholeBody, nil)
		b = readAll(t, resp)
		var w whole
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &w) != nil || len(w.Choices) != 1 {
			t.Fatalf("n%d not streamed: %d %s", i+1, resp.StatusCode, b)
		}
		checkPrefillNode(t, fmt.Sprintf("n%d not streamed", i+1), resp, before, engineRuns(t, tn))
		if w.Choices[0].Message.Content != wantWhole.Choices[0].Message.Content || w.Choices[0].FinishReason != wantWhole.Choices[0].FinishReason ||
			w.Usage.PromptTokens != wantWhole.Usage.PromptTokens || w.Usage.CompletionTokens != wantWhole.Usage.CompletionTokens {
			t.Errorf("n%d not streamed: %s, want %s", i+1, b, ref[1])
		}
		if got := metric(t, url, "kvmesh_route_disaggregated_total", `outcome="split"`); got != 2 {
			t.Errorf("n%d: split = %v, want 2", i+1, got)
		}
		if got := metric(t, url, "kvmesh_route_disaggregated_total", `outcome="handover"`); got != 2 {
			t.Errorf("n%d: handover = %v, want 2", i+1, got)
		}
		assertReconciled(t, url, 2)
	}
}

// engineRuns is each node of tn's kvmesh_engine_requests_total (halves and whole requests),
// by name.
func engineRuns(t *testing.T, tn *testnet.Net) map[string]float64 {
	t.Helper()
	runs := map[string]float64{}
	for i, url := range tn.URLs() {
		runs[tn.Nodes[i].Name()] = metric(t, url, "kvmesh_engine_requests_total", "")
	}
	return runs
}

// checkPrefillNode checks that resp, a split request's, names once in HeaderPrefillNode a node
// other than the one that answered (HeaderNode), whose engine ran one request between before
// and after: the prefill half.
func checkPrefillNode(t *testing.T, what string, resp *http.Response, before, after map[string]float64) {
	t.Helper()
	got := resp.Header.Values(node.HeaderPrefillNode)
	if len(got) != 1 || got[0] == resp.Header.Get(node.HeaderNode) || after[got[0]]-before[got[0]] != 1 {
		t.Errorf("%s: %s %q (%s %q), engine runs %v then %v; want the one prefill node whose engine ran the half",
			what, node.HeaderPrefillNode, got, node.HeaderNode, resp.Header.Get(node.HeaderNode), before, after)
	}
}

// TestSplitMeshWithMixedNodes pins that mixed nodes still take whole requests in a mesh with
// prefill and decode nodes: a short prompt runs whole on the mixed node, never split (and
// names no prefill node).
func TestSplitMeshWithMixedNodes(t *testing.T) {
	tn := startNet(t, 3, roles("mixed", "prefill", "decode"))
	url := tn.URLs()[1] // the prefill node is the ingress
	resp := post(t, url, "/v1/chat/completions", chatBody("a short question", 8, false), nil)
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK || resp.Header.Get(node.HeaderNode) != "n1" {
		t.Fatalf("%d from %q: %s, want 200 from the mixed node n1", resp.StatusCode, resp.Header.Get(node.HeaderNode), b)
	}
	if got := resp.Header.Values(node.HeaderPrefillNode); len(got) != 0 {
		t.Errorf("a whole request's response has %s %q", node.HeaderPrefillNode, got)
	}
	if got := metric(t, url, "kvmesh_route_disaggregated_total", `outcome="whole_short"`); got != 1 {
		t.Errorf("whole_short = %v, want 1", got)
	}
	if got := metric(t, url, "kvmesh_route_disaggregated_total", `outcome="split"`); got != 0 {
		t.Errorf("split = %v, want 0", got)
	}
}

// TestFailedPairRunsWhole pins a split request whose prefill nodes cannot be reached falling
// back to a whole run on the mixed node, its next candidate: that response names no prefill
// node, as a split one does.
func TestFailedPairRunsWhole(t *testing.T) {
	tn := startNet(t, 4, func(i int, cfg *node.Config) {
		roles("mixed", "prefill", "decode", "prefill")(i, cfg)
		// Prompts of 600 tokens split, the mixed node being slower than the pair; two
		// attempts are both prefill nodes', the slow mixed node the last prefill candidate.
		cfg.Route.SplitMinTokens, cfg.Route.LinkGBps = 256, 1000
		cfg.ForwardAttempts = 2
		if i == 0 {
			cfg.Sim.StepPerToken = 3 * time.Millisecond
		}
	})
	url := tn.URLs()[0] // the mixed node is the ingress
	resp := post(t, url, "/v1/chat/completions", chatBody(longPrompt("paired", 600), 16, true), nil)
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK || resp.Header.Get(node.HeaderNode) != "n3" ||
		(resp.Header.Get(node.HeaderPrefillNode) != "n2" && resp.Header.Get(node.HeaderPrefillNode) != "n4") {
		t.Fatalf("%d from %q, prefill %q: %s; want 200 split on a prefill node and n3", resp.StatusCode,
			resp.Header.Get(node.HeaderNode), resp.Header.Get(node.HeaderPrefillNode), b)
	}

	for _, i := range []int{1, 3} {
		if err := tn.Nodes[i].KillTransport(); err != nil {
			t.Fatal(err)
		}
	}
	resp = post(t, url, "/v1/chat/completions", chatBody(longPrompt("fallback", 600), 16, true), nil)
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK || resp.Header.Get(node.HeaderNode) != "n1" || !readStream(t, b).done {
		t.Fatalf("%d from %q: %s; want 200 from the mixed node n1", resp.StatusCode, resp.Header.Get(node.HeaderNode), b)
	}
	if got := resp.Header.Values(node.HeaderPrefillNode); len(got) != 0 {
		t.Errorf("run whole after the pair failed, yet %s %q", node.HeaderPrefillNode, got)
	}
	for o, want := range map[string]float64{"split": 2, "handover": 1, "prefill_failed": 1, "whole_no_pair": 1} {
		if n := metric(t, url, "kvmesh_route_disaggregated_total", `outcome="`+o+`"`); n != want {
			t.Errorf("%s = %v, want %v", o, n, want)
		}
	}
	assertReconciled(t, url, 2)
}

// TestPrefillNodeDiesBeforeHandover pins the prefill half's failures: a prefill node that
// cannot be reached is replaced by another prefill node, and with none left the request ends
// at once with an explicit 502, never hanging.
func TestPrefillNodeDiesBeforeHandover(t *testing.T) {
	tn := startNet(t, 3, roles("decode", "prefill", "prefill"))
	prefillDies(t, tn, func(i int) error { return tn.Nodes[i].KillTransport() }, node.CodeOwnerUnreachable)
}

// prefillDies runs TestPrefillNodeDiesBeforeHandover's story on tn, a decode node and two
// prefill nodes, with kill(i) taking prefill node i out; code is the 502's once both are out.
func prefillDies(t *testing.T, tn *testnet.Net, kill func(i int) error, code string) {
	t.Helper()
	url := tn.URLs()[0] // the decode node is the ingress: both prefill nodes are peers
	prompt := longPrompt("dies", 800)
	body := chatBody(prompt, 16, true)
	resp := post(t, url, "/v1/chat/completions", body, nil)
	first := readAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, first)
	}
	// Kill the prefill node that holds the prompt's prefix now: the next request prefers it.
	served, other := 1, 2
	if metric(t, tn.URLs()[2], "kvmesh_engine_requests_total", `origin="peer"`) > 0 {
		served, other = 2, 1
	}
	if err := kill(served); err != nil {
		t.Fatal(err)
	}
	resp = post(t, url, "/v1/chat/completions", body, nil)
	b := readAll(t, resp)
	if resp.StatusCode != http.StatusOK || readStream(t, b).text != readStream(t, first).text {
		t.Fatalf("after the prefill node died: %d %s", resp.StatusCode, b)
	}
	if got := metric(t, url, "kvmesh_route_disaggregated_total", `outcome="prefill_retried"`); got != 1 {
		t.Errorf("prefill_retried = %v, want 1", got)
	}
	if got := metric(t, tn.URLs()[other], "kvmesh_engine_requests_total", `origin="peer"`); got != 1 {
		t.Errorf("the other prefill node ran %v prefills, want 1", got)
	}

	// No prefill node left: an explicit 502, quickly.
	if err := kill(other); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	resp = post(t, url, "/v1/chat/completions", chatBody(longPrompt("none", 800), 16, true), map[string]string{node.HeaderQueueTTL: "20s"})
	b = readAll(t, resp)
	if e := decodeError(t, b).Error; resp.StatusCode != http.StatusBadGateway || e.Code != code {
		t.Fatalf("%d %s, want 502 %s", resp.StatusCode, b, code)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the request took %v to fail", d)
	}
	assertReconciled(t, url, 3)
}

// TestDecodeNodeDiesMidStreamMigrates pins a split request's decode node dying mid-stream:
// the request migrates as any owner's does, and its continuation is itself split (prefilled
// here with the text sent, decoded on the other decode node from the handover and the resume
// record), so the client reads the unbroken run's text in one stream.
func TestDecodeNodeDiesMidStreamMigrates(t *testing.T) {
	const path, maxTokens = "/v1/chat/completions", 120
	ref := startNet(t, 1, func(_ int, cfg *node.Config) { cfg.Sim.TimeScale = 1 })
	want, wantFinish, wantUsage := reference(t, ref.URLs()[0], path, genBody(path, maxTokens, false))

	tn := startNet(t, 3, func(i int, cfg *node.Config) {
		roles("prefill", "decode", "decode")(i, cfg)
		cfg.Sim.TimeScale = 1
	})
	got := streamKillingOwner(t, tn, path, maxTokens)
	if got.text != want || got.last != "[DONE]" || len(got.finishes) != 1 || got.finishes[0] != wantFinish || got.roles != 1 {
		t.Errorf("client read %q (%d role chunks, finishes %q, last %q)\nwant %q", got.text, got.roles, got.finishes, got.last, want)
	}
	if got.usage == nil || got.usage.PromptTokens != wantUsage.PromptTokens || got.usage.CompletionTokens != wantUsage.CompletionTokens {
		t.Errorf("usage %+v, want %+v", got.usage, wantUsage)
	}
	url := tn.URLs()[0]
	if n := metric(t, url, "kvmesh_migrations_total", `outcome="completed"`); n != 1 {
		t.Errorf("migrations completed = %v, want 1", n)
	}
	if n := metric(t, url, "kvmesh_route_disaggregated_total", `outcome="handover"`); n != 2 {
		t.Errorf("handovers = %v, want 2 (the request's and its continuation's)", n)
	}
	assertReconciled(t, url, 1)
}
