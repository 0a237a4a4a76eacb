package node_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/node"
)

func TestChatStreamingEndsWithDoneAndUsage(t *testing.T) {
	tn := startNet(t, 1, nil)
	url := tn.URLs()[0]
	resp := post(t, url, "/v1/chat/completions", chatBody("hello there", 12, true), nil)
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type %q", ct)
	}
	if got := resp.Header.Get(node.HeaderNode); got != "n1" {
		t.Errorf("%s = %q, want n1", node.HeaderNode, got)
	}
	if resp.Header.Get(node.HeaderRequestID) == "" {
		t.Errorf("no %s", node.HeaderRequestID)
	}
	ev := sseEvents(t, body)
	if len(ev) < 4 || ev[len(ev)-1] != "[DONE]" {
		t.Fatalf("events %q: want role, content..., finish, usage, [DONE]", ev)
	}
	var first struct {
		Object  string `json:"object"`
		Choices []struct {
			Delta struct{ Role string } `json:"delta"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(ev[0]), &first); err != nil || first.Object != "chat.completion.chunk" || first.Choices[0].Delta.Role != "assistant" {
		t.Errorf("first event %s", ev[0])
	}
	u := streamUsage(t, ev)
	if u.CompletionTokens < 1 || u.CompletionTokens > 12 || u.PromptTokens == 0 {
		t.Errorf("usage %+v", u)
	}
	var finish string
	for _, e := range ev {
		var c struct {
			Choices []struct {
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(e), &c) == nil && len(c.Choices) == 1 && c.Choices[0].FinishReason != nil {
			finish = *c.Choices[0].FinishReason
		}
	}
	if finish != "stop" && finish != "length" {
		t.Errorf("finish_reason %q", finish)
	}
}

func TestChatNonStreaming(t *testing.T) {
	tn := startNet(t, 1, nil)
	resp := post(t, tn.URLs()[0], "/v1/chat/completions", chatBody("write a haiku", 8, false), nil)
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var c struct {
		Object  string `json:"object"`
		Choices []struct {
			Message      struct{ Role, Content string } `json:"message"`
			FinishReason string                         `json:"finish_reason"`
		} `json:"choices"`
		Usage usage `json:"usage"`
	}
	if err := json.Unmarshal(body, &c); err != nil {
		t.Fatal(err)
	}
	if c.Object != "chat.completion" || len(c.Choices) != 1 || c.Choices[0].Message.Role != "assistant" {
		t.Fatalf("body %s", body)
	}
	if c.Usage.CompletionTokens < 1 || c.Usage.CompletionTokens > 8 {
		t.Errorf("usage %+v", c.Usage)
	}
	if c.Choices[0].Message.Content == "" {
		t.Errorf("empty content")
	}
}

func TestCompletionsStreamingAndNot(t *testing.T) {
	tn := startNet(t, 1, nil)
	url := tn.URLs()[0]
	resp := post(t, url, "/v1/completions", `{"model":"`+model+`","prompt":"once upon a time","max_tokens":5}`, nil)
	body := readAll(t, resp)
	var c struct {
		Object  string `json:"object"`
		Choices []struct {
			Text         string  `json:"text"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(body, &c) != nil || c.Object != "text_completion" || c.Choices[0].FinishReason == nil {
		t.Fatalf("non-streaming: %d %s", resp.StatusCode, body)
	}
	resp = post(t, url, "/v1/completions", `{"model":"`+model+`","prompt":"once upon a time","max_tokens":5,"stream":true}`, nil)
	ev := sseEvents(t, readAll(t, resp))
	if resp.StatusCode != 200 || len(ev) < 2 || ev[len(ev)-1] != "[DONE]" {
		t.Fatalf("streaming: %d %q", resp.StatusCode, ev)
	}
	for _, e := range ev[:len(ev)-1] {
		if strings.Contains(e, `"usage"`) {
			t.Errorf("usage sent without include_usage: %s", e)
		}
	}
}

func TestRefusalStatusCodes(t *testing.T) {
	tn := startNet(t, 1, func(i int, cfg *node.Config) {
		cfg.MaxBodyBytes = 64 << 10
	})
	url := tn.URLs()[0]
	huge := `{"model":"` + model + `","messages":[{"role":"user","content":"` + strings.Repeat("a", 70<<10) + `"}]}`
	tooLong := `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}],"max_tokens":200000}`
	cases := []struct {
		name, path, body string
		hdr              map[string]string
		status           int
		code             string
	}{
		{"malformed JSON", "/v1/chat/completions", `{"model":`, nil, 400, "invalid_request"},
		{"unknown field the embedded engine cannot honour", "/v1/chat/completions", `{"model":"` + model + `","messages":[{"role":"user","content":"x"}],"bogus":1}`, nil, 400, "unsupported_parameter"},
		{"wrong type", "/v1/chat/completions", `{"model":"` + model + `","messages":"x"}`, nil, 400, "invalid_parameter"},
		{"a client's kv_transfer_params", "/v1/completions", `{"model":"` + model + `","prompt":"x","kv_transfer_params":{"do_remote_prefill":true,"remote_host":"10.0.0.5","remote_port":22}}`, nil, 400, "invalid_parameter"},
		{"body too large", "/v1/chat/completions", huge, nil, 413, "body_too_large"},
		{"unknown model", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, nil, 404, "model_not_found"},
		{"max_tokens zero", "/v1/chat/completions", `{"model":"` + model + `","messages":[{"role":"user","content":"x"}],"max_tokens":0}`, nil, 400, "invalid_parameter"},
		{"temperature out of range", "/v1/completions", `{"model":"` + model + `","prompt":"x","temperature":3}`, nil, 400, "invalid_parameter"},
		{"context exceeded", "/v1/chat/completions", tooLong, nil, 400, "context_length_exceeded"},
		{"bad priority header", "/v1/chat/completions", chatBody("x", 4, false), map[string]string{node.HeaderPriority: "urgent"}, 400, "invalid_parameter"},
		{"bad TTL header", "/v1/chat/completions", chatBody("x", 4, false), map[string]string{node.HeaderQueueTTL: "soon"}, 400, "invalid_parameter"},
		{"embeddings body too large", "/v1/embeddings", `{"model":"` + model + `","input":"` + strings.Repeat("a", 70<<10) + `"}`, nil, 413, "body_too_large"},
		{"embeddings bad priority header", "/v1/embeddings", `{"model":"` + model + `","input":"x"}`, map[string]string{node.HeaderPriority: "urgent"}, 400, "invalid_parameter"},
		{"responses body too large", "/v1/responses", `{"model":"` + model + `","input":"` + strings.Repeat("a", 70<<10) + `"}`, nil, 413, "body_too_large"},
		{"unknown path", "/v1/audio/speech", `{}`, nil, 404, "not_found"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp := post(t, url, c.path, c.body, c.hdr)
			body := readAll(t, resp)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, body)
			}
			if e := decodeError(t, body); e.Error.Code != c.code || e.Error.Message == "" {
				t.Errorf("error %+v, want code %s", e.Error, c.code)
			}
			if c.code != "not_found" && resp.Header.Get(node.HeaderReason) != c.code {
				t.Errorf("%s = %q", node.HeaderReason, resp.Header.Get(node.HeaderReason))
			}
		})
	}
}

func TestAPIKeysAndRateLimitHoldWhateverTheHeaders(t *testing.T) {
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys")
	// One key, a bucket of 600 tokens refilling at 1 token/s: two small requests pass, a third does not.
	if err := os.WriteFile(keys, []byte(admit.HashKey("sk-alpha")+" alpha 1 600\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tn := startNet(t, 1, func(i int, cfg *node.Config) { cfg.APIKeysFile = keys })
	url := tn.URLs()[0]
	body := chatBody(strings.Repeat("x", 400), 150, false) // ~110 prompt tokens + 150
	resp := post(t, url, "/v1/chat/completions", body, nil)
	if readAll(t, resp); resp.StatusCode != 401 {
		t.Fatalf("no key: status %d, want 401", resp.StatusCode)
	}
	resp = post(t, url, "/v1/chat/completions", body, map[string]string{"Authorization": "Bearer sk-wrong"})
	if readAll(t, resp); resp.StatusCode != 401 {
		t.Fatalf("wrong key: status %d, want 401", resp.StatusCode)
	}
	auth := map[string]string{"Authorization": "Bearer sk-alpha"}
	statuses := []int{}
	for i := range 3 {
		h := map[string]string{"Authorization": auth["Authorization"], node.HeaderPriority: "high", node.HeaderAgent: "agent-" + string(rune('a'+i)), "X-Forwarded-For": "10.0.0." + string(rune('1'+i))}
		resp := post(t, url, "/v1/chat/completions", body, h)
		b := readAll(t, resp)
		statuses = append(statuses, resp.StatusCode)
		if resp.StatusCode == 429 {
			if decodeError(t, b).Error.Code != "rate_limited" || resp.Header.Get("Retry-After") == "" {
				t.Errorf("429 without rate_limited and Retry-After: %s", b)
			}
		}
	}
	if statuses[0] != 200 || statuses[1] != 200 || statuses[2] != 429 {
		t.Errorf("statuses %v, want [200 200 429]", statuses)
	}
}

func TestRepeatedPromptReportsCachedTokens(t *testing.T) {
	tn := startNet(t, 1, nil)
	url := tn.URLs()[0]
	body := chatBody(longPrompt("cache", 2000), 4, true)
	first := streamUsage(t, sseEvents(t, readAll(t, post(t, url, "/v1/chat/completions", body, nil))))
	second := streamUsage(t, sseEvents(t, readAll(t, post(t, url, "/v1/chat/completions", body, nil))))
	if first.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("first request cached %d tokens of a new prompt", first.PromptTokensDetails.CachedTokens)
	}
	if second.PromptTokensDetails.CachedTokens < 1900 {
		t.Errorf("second request cached %d of %d tokens", second.PromptTokensDetails.CachedTokens, second.PromptTokens)
	}
}

func TestClientDisconnectCancelsEngineWork(t *testing.T) {
	tn := startNet(t, 1, func(i int, cfg *node.Config) { cfg.Sim.TimeScale = 1 })
	url := tn.URLs()[0]
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chatBody("go on forever", 5000, true)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	buf := make([]byte, 256)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "the request to run", func() bool { return selfOf(peers(t, url)).Running == 1 })
	cancel()
	resp.Body.Close()
	poll.Until(t, 5*time.Second, "the engine's running count to drop", func() bool { return selfOf(peers(t, url)).Running == 0 })
}

func TestModelsHealthReadyMetrics(t *testing.T) {
	tn := startNet(t, 1, nil)
	url := tn.URLs()[0]
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var ml struct {
		Object string `json:"object"`
		Data   []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(readAll(t, resp), &ml); err != nil || ml.Object != "list" || len(ml.Data) != 1 || ml.Data[0].ID != model {
		t.Errorf("models %+v %v", ml, err)
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get(url + p)
		if err != nil {
			t.Fatal(err)
		}
		if readAll(t, resp); resp.StatusCode != 200 {
			t.Errorf("%s: %d", p, resp.StatusCode)
		}
	}
	readAll(t, post(t, url, "/v1/chat/completions", chatBody("x", 3, false), nil))
	resp, err = http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	text := string(readAll(t, resp))
	for _, fam := range []string{"kvmesh_engine_requests_running", "kvmesh_engine_kv_use_ratio", "kvmesh_engine_prefix_hit_ratio", "kvmesh_build_info",
		"kvmesh_requests_received_total", "kvmesh_admission_decisions_total", "kvmesh_gossip_members", "kvmesh_gpu_power_watts"} {
		if !strings.Contains(text, fam) {
			t.Errorf("/metrics lacks %s", fam)
		}
	}
}

func TestCountersReconcile(t *testing.T) {
	tn := startNet(t, 1, nil)
	url := tn.URLs()[0]
	for i := range 6 {
		body := chatBody("reconcile", 3, i%2 == 0)
		if i == 4 {
			body = `{"model":"nope","messages":[{"role":"user","content":"x"}]}`
		}
		readAll(t, post(t, url, "/v1/chat/completions", body, nil))
	}
	received := metric(t, url, "kvmesh_requests_received_total", "")
	done := metric(t, url, "kvmesh_requests_completed_total", "") + metric(t, url, "kvmesh_requests_refused_total", "") +
		metric(t, url, "kvmesh_requests_failed_total", "")
	if received != 6 || done != received {
		t.Errorf("received %v, completed+refused+failed %v", received, done)
	}
	if got := metric(t, url, "kvmesh_requests_refused_total", `code="model_not_found"`); got != 1 {
		t.Errorf("model_not_found refusals %v", got)
	}
}

// TestShutdownDoesNotWaitForUnusedConnections pins that a drain ends when the in-flight
// requests do, not when every client connection goes idle: net/http's Shutdown counts a
// connection that never sent a request as busy for 5 s, so a client that dialled one spare
// (HTTP transports do, racing a dial against a connection coming free) made every drain
// shorter than that fail with its deadline, though no request was cut.
func TestShutdownDoesNotWaitForUnusedConnections(t *testing.T) {
	tn := startNet(t, 1, func(i int, cfg *node.Config) { cfg.DrainTimeout = time.Second; cfg.Sim.TimeScale = 2 })
	n, base := tn.Nodes[0], tn.URLs()[0]
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	spare, err := net.Dial("tcp", u.Host) // connected, never used
	if err != nil {
		t.Fatal(err)
	}
	defer spare.Close()
	done := make(chan int, 1)
	go func() {
		resp := post(t, base, "/v1/chat/completions", chatBody("drain me", 60, true), nil)
		readAll(t, resp)
		done <- resp.StatusCode
	}()
	poll.Until(t, 5*time.Second, "the request to run", func() bool { return selfOf(peers(t, base)).Running == 1 })
	if err := n.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown with an unused connection open: %v", err)
	}
	if status := <-done; status != http.StatusOK {
		t.Fatalf("in-flight request: status %d", status)
	}
}

func TestShutdownDrainsInFlightRequests(t *testing.T) {
	tn := startNet(t, 1, func(i int, cfg *node.Config) { cfg.Sim.TimeScale = 2 })
	n := tn.Nodes[0]
	url := tn.URLs()[0]
	type result struct {
		status int
		events []string
	}
	done := make(chan result, 1)
	go func() {
		resp := post(t, url, "/v1/chat/completions", chatBody("drain me", 60, true), nil)
		done <- result{resp.StatusCode, sseEvents(t, readAll(t, resp))}
	}()
	poll.Until(t, 5*time.Second, "the request to run", func() bool { return selfOf(peers(t, url)).Running == 1 })
	if err := n.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.status != 200 || len(r.events) == 0 || r.events[len(r.events)-1] != "[DONE]" {
		t.Fatalf("in-flight request: status %d, events %q", r.status, r.events)
	}
	if _, err := http.Get(url + "/healthz"); err == nil {
		t.Errorf("node still serves after Shutdown")
	}
}

func TestNodeInFrontOfKvmeshEngineAsExternalEngine(t *testing.T) {
	engine := startEngine(t)
	tn := startNet(t, 1, func(i int, cfg *node.Config) { cfg.Engine, cfg.EngineKind = engine, "vllm" })
	url := tn.URLs()[0]
	body := chatBody(longPrompt("external", 1000), 6, true)
	readAll(t, post(t, url, "/v1/chat/completions", body, nil))
	resp := post(t, url, "/v1/chat/completions", body, nil)
	ev := sseEvents(t, readAll(t, resp))
	if resp.StatusCode != 200 || resp.Header.Get(node.HeaderNode) != "n1" || ev[len(ev)-1] != "[DONE]" {
		t.Fatalf("status %d node %q events %q", resp.StatusCode, resp.Header.Get(node.HeaderNode), ev)
	}
	if u := streamUsage(t, ev); u.PromptTokensDetails.CachedTokens == 0 {
		t.Errorf("the engine's cached_tokens did not come through: %+v", u)
	}
	// vLLM's fields pass the node; kvmesh engine runs the no-ops and refuses, by name, what it
	// cannot keep, and the node relays that refusal as it is.
	base := `{"model":"` + model + `","messages":[{"role":"user","content":"x"}],"max_tokens":3,"top_k":40,"min_p":0.1`
	if resp := post(t, url, "/v1/chat/completions", base+`}`, nil); resp.StatusCode != 200 {
		t.Errorf("top_k and min_p: status %d: %s", resp.StatusCode, readAll(t, resp))
	} else {
		readAll(t, resp)
	}
	resp = post(t, url, "/v1/chat/completions", base+`,"guided_json":{"type":"object"}}`, nil)
	if e := decodeError(t, readAll(t, resp)); resp.StatusCode != 400 || e.Error.Code != "unsupported_parameter" ||
		e.Error.Param == nil || *e.Error.Param != "guided_json" {
		t.Errorf("guided_json: status %d, error %+v", resp.StatusCode, e.Error)
	}
	// A file part passes the node and is refused by kvmesh engine, which reads text, images
	// and audio only.
	resp = post(t, url, "/v1/chat/completions", `{"model":"`+model+`","messages":[{"role":"user","content":[`+
		`{"type":"file","file":{"file_id":"f"}}]}]}`, nil)
	if e := decodeError(t, readAll(t, resp)); resp.StatusCode != 400 || e.Error.Code != "unsupported_parameter" ||
		e.Error.Param == nil || *e.Error.Param != "messages[0].content" || !strings.Contains(e.Error.Message, `"file"`) {
		t.Errorf("file part: status %d, error %+v", resp.StatusCode, e.Error)
	}
	// The node scrapes the engine's vLLM metrics into its state record.
	poll.Until(t, 5*time.Second, "the scraped KV size", func() bool {
		s := selfOf(peers(t, url))
		return s.KVBlocksTotal == 1<<16 && s.EngineKind == "vllm" && s.EngineHealthy
	})
}

// TestSeedlessRepliesFollowThePrompt: without a seed the embedded engine's reply is picked by
// the prompt (the same prompt, the same reply), not one text for every request.
func TestSeedlessRepliesFollowThePrompt(t *testing.T) {
	url := startNet(t, 1, nil).URLs()[0]
	reply := func(prompt string) string {
		t.Helper()
		resp := post(t, url, "/v1/chat/completions", chatBody(prompt, 8, false), nil)
		var out struct {
			Choices []struct{ Message struct{ Content string } }
		}
		if b := readAll(t, resp); resp.StatusCode != 200 || json.Unmarshal(b, &out) != nil || len(out.Choices) != 1 {
			t.Fatalf("%q: %d %s", prompt, resp.StatusCode, b)
		}
		return out.Choices[0].Message.Content
	}
	a, b := reply("first prompt"), reply("a different prompt")
	if a == b {
		t.Errorf("two prompts got the same reply %q", a)
	}
	if again := reply("first prompt"); again != a {
		t.Errorf("the same prompt got %q, then %q", a, again)
	}
}

// TestDrainTimeoutEndsStragglersWithAnError: a request still running when the drain timeout
// passes ends with an explicit error naming the drain, an error event on a stream and a 503
// on a response not yet sent, on the node that ran it and on an ingress relaying a peer's
// stream; the connection is not simply cut.
func TestDrainTimeoutEndsStragglersWithAnError(t *testing.T) {
	send := func(url, body string) <-chan answer { return sendAsync(url, "/v1/chat/completions", body, nil) }
	drained := func(t *testing.T, a answer, stream bool) {
		t.Helper()
		if a.err != nil {
			t.Fatalf("the client's read failed: %v", a.err)
		}
		b := a.body
		if stream {
			ev := sseEvents(t, b)
			if a.status != http.StatusOK || len(ev) == 0 {
				t.Fatalf("status %d, events %q", a.status, ev)
			}
			b = []byte(ev[len(ev)-1])
		} else if a.status != http.StatusServiceUnavailable {
			t.Fatalf("status %d (%s); want 503", a.status, b)
		}
		if e := decodeError(t, b); e.Error.Code != node.CodeDraining || !strings.Contains(e.Error.Message, "drain timeout") {
			t.Errorf("the response ends with %s; want the drain's error", b)
		}
	}
	slow := func(i int, cfg *node.Config) { cfg.Sim.TimeScale, cfg.DrainTimeout = 1, 200*time.Millisecond }
	t.Run("local", func(t *testing.T) {
		tn := startNet(t, 1, slow)
		url := tn.URLs()[0]
		stream, whole := send(url, genBody("/v1/chat/completions", 400, true)), send(url, genBody("/v1/chat/completions", 400, false))
		poll.Until(t, 5*time.Second, "both requests to run", func() bool { return selfOf(peers(t, url)).Running == 2 })
		_ = tn.Nodes[0].Shutdown(context.Background()) // its drain timed out: an error
		drained(t, <-stream, true)
		drained(t, <-whole, false)
	})
	t.Run("waiting in the room", func(t *testing.T) {
		tn := startNet(t, 1, slow)
		n, url := tn.Nodes[0], tn.URLs()[0]
		n.HoldKV(4096, true) // the engine's whole KV: every request waits for room
		waiting := send(url, genBody("/v1/chat/completions", 8, false))
		poll.Until(t, 5*time.Second, "the request to wait", func() bool {
			return metric(t, url, "kvmesh_admission_queue_requests", `priority="0"`) == 1
		})
		_ = n.Shutdown(context.Background())
		// The room answers it at once (its node is no candidate now), or the drain does.
		if a := <-waiting; a.err != nil || a.status != http.StatusServiceUnavailable || decodeError(t, a.body).Error.Code == "" {
			t.Errorf("a request waiting in the room got %d %s (%v); want an explicit 503", a.status, a.body, a.err)
		}
	})
	t.Run("relayed", func(t *testing.T) {
		tn := startNet(t, 2, func(i int, cfg *node.Config) {
			slow(i, cfg)
			if i == 0 {
				cfg.Models = []string{"another-model"} // an ingress only
			}
		})
		urls := tn.URLs()
		stream := send(urls[0], genBody("/v1/chat/completions", 400, true))
		poll.Until(t, 5*time.Second, "the request to run on the peer", func() bool { return selfOf(peers(t, urls[1])).Running == 1 })
		_ = tn.Nodes[0].Shutdown(context.Background())
		drained(t, <-stream, true)
	})
}
