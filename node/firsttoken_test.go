package node_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/node"
)

// stallEngine is a vLLM server whose queue never reaches the requests it takes: it answers a
// generation not at all, or (a prompt holding "headers") only its 200 and stream headers,
// until the node cancels it, and counts both. A prompt holding "slow" gets its first token at
// once and the rest only after a second; the first one holding "dies" too is cut short then
// instead. A prefill (do_remote_decode) is answered at once with its handover when handover
// is set.
type stallEngine struct {
	srv       *httptest.Server
	handover  atomic.Bool
	started   atomic.Int64 // generations that reached it (prefills included)
	cancelled atomic.Int64 // of those, the ones whose request the node cancelled
	prefills  atomic.Int64
	died      atomic.Bool
}

func newStallEngine(t *testing.T) *stallEngine {
	t.Helper()
	s := &stallEngine{}
	stop := make(chan struct{})
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","max_model_len":8192}]}`, model)
			return
		case "/metrics":
			_, _ = io.WriteString(w, "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")
			return
		}
		b, _ := io.ReadAll(r.Body)
		body := string(b)
		prefill := strings.Contains(body, "do_remote_decode")
		if prefill {
			s.prefills.Add(1)
			if s.handover.Load() {
				_, _ = io.WriteString(w, `{"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"e"},"usage":{"prompt_tokens":200}}`)
				return
			}
		}
		s.started.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		switch {
		case strings.Contains(body, "slow"):
			fmt.Fprintf(w, "data: %s\n\n", `{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}`)
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				s.cancelled.Add(1)
				return
			case <-time.After(time.Second): // an engine that decodes slowly: well past the TTL
			}
			if strings.Contains(body, "dies") && s.died.CompareAndSwap(false, true) {
				return // the stream ends without its finish: the owner's engine failed
			}
			for _, e := range []string{
				`{"choices":[{"index":0,"delta":{"content":" there"},"finish_reason":"stop"}]}`,
				`{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`, "[DONE]",
			} {
				fmt.Fprintf(w, "data: %s\n\n", e)
			}
			return
		case strings.Contains(body, "headers"):
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
		}
		select {
		case <-r.Context().Done():
			s.cancelled.Add(1)
		case <-stop: // the test is over, and failed: nothing cancelled the request
		}
	}))
	t.Cleanup(s.srv.Close)
	t.Cleanup(func() { close(stop) }) // first: a stalled handler must not keep Close waiting
	return s
}

// external points a node at s as at a vLLM server.
func (s *stallEngine) external(cfg *node.Config) {
	cfg.Engine, cfg.EngineKind, cfg.Models, cfg.ModelsInterval = s.srv.URL, "vllm", nil, 10*time.Millisecond
	cfg.EngineMessages = "off" // the engine counts every request it is sent: no probe of /v1/messages
}

// allCancelled waits until every generation that reached s has had its request cancelled.
func (s *stallEngine) allCancelled(t *testing.T, want int64) {
	t.Helper()
	if !poll.Within(10*time.Second, func() bool { return s.started.Load() == want && s.cancelled.Load() == want }) {
		t.Errorf("the engine took %d requests and saw %d cancelled, want %d of each", s.started.Load(), s.cancelled.Load(), want)
	}
}

// postWithin posts a chat request with a queue TTL and reads the answer; the client gives up
// after a generous bound, so that a request nothing ends fails the test instead of hanging it.
func postWithin(t *testing.T, url, body, ttl string) (*http.Response, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(node.HeaderQueueTTL, ttl)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	return resp, b
}

// wantEngineTimeout checks that the answer is the explicit 504 engine_timeout naming the bound.
func wantEngineTimeout(t *testing.T, resp *http.Response, b []byte, what string) {
	t.Helper()
	e := decodeError(t, b).Error
	if resp.StatusCode != http.StatusGatewayTimeout || e.Code != "engine_timeout" || resp.Header.Get(node.HeaderReason) != "engine_timeout" ||
		!strings.Contains(e.Message, what+" within the queue TTL (300ms)") {
		t.Errorf("%d %s, want 504 engine_timeout: %s within the queue TTL (300ms)", resp.StatusCode, b, what)
	}
}

// TestEngineQueueBoundedByQueueTTL pins the first-token bound: a request an engine takes and
// never starts (it stalls before its answer's headers, or after them) ends within its queue
// TTL with an explicit 504 engine_timeout, forwarded or run by its ingress, streamed or not,
// and the node that ran it cancels the engine's request. The owner's 504 reaches the client
// as it is: the ingress tries no other owner (the mesh has two) past the deadline. A request
// whose first token came in time runs to its end, however long that takes. Without the bound
// the stalled requests got no answer at all.
func TestEngineQueueBoundedByQueueTTL(t *testing.T) {
	s := newStallEngine(t)
	tn := startNet(t, 3, func(i int, cfg *node.Config) {
		if i == 0 {
			cfg.Models = []string{"another-model"} // an ingress only: forwards every request
			cfg.Route.Delegate = new(bool)         // itself: its forwards are counted here
			return
		}
		s.external(cfg)
	})
	urls := tn.URLs()
	tests := []struct {
		name    string
		ingress int
		prompt  string
		stream  bool
	}{
		{"forwarded", 0, "hello", false},
		{"forwarded stream, after the headers", 0, "hello headers", true},
		{"local stream", 1, "hello", true},
		{"local, after the headers", 1, "hello headers", false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, b := postWithin(t, urls[tt.ingress], chatBody(tt.prompt, 8, tt.stream), "300ms")
			wantEngineTimeout(t, resp, b, "no first token")
			s.allCancelled(t, int64(i+1))
		})
	}
	t.Run("first token in time", func(t *testing.T) {
		resp, b := postWithin(t, urls[0], chatBody("slow", 8, true), "300ms")
		if u := streamUsage(t, sseEvents(t, b)); resp.StatusCode != http.StatusOK || u.CompletionTokens != 2 {
			t.Errorf("%d %s, want the whole stream", resp.StatusCode, b)
		}
	})
	t.Run("owner failing past the deadline", func(t *testing.T) {
		// The first owner's engine fails after its first token, past the deadline: the
		// unstreamed request runs again on the other owner, with its TTL afresh.
		resp, b := postWithin(t, urls[0], chatBody("slow dies", 8, false), "300ms")
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "hi there") {
			t.Errorf("%d %s, want the whole answer from the second owner", resp.StatusCode, b)
		}
	})
	for i, want := range []float64{2, 2, 0} {
		if got := metric(t, urls[i], "kvmesh_requests_failed_total", `code="engine_timeout"`); got != want {
			t.Errorf("n%d: failed{engine_timeout} = %v, want %v", i+1, got, want)
		}
	}
	if got := metric(t, urls[0], "kvmesh_forward_attempts_total", `result="owner_failed"`); got != 3 {
		t.Errorf("owner_failed forwards = %v, want 3 (one owner each for the two timeouts, no other tried; the owner that died)", got)
	}
	assertReconciled(t, urls[0], 4)
	assertReconciled(t, urls[1], 2)
	assertReconciled(t, urls[2], 0)
}

// TestSplitRequestHalvesBoundedByQueueTTL pins the first-token bound on both halves of a split
// request: a prefill node whose engine never prefills ends the request with a 504
// engine_timeout naming the handover, and a decode node whose engine never starts the decode
// with one naming the first token, each at the deadline the ingress set, with the engine's
// request cancelled on the node that ran it.
func TestSplitRequestHalvesBoundedByQueueTTL(t *testing.T) {
	prefill, decode := newStallEngine(t), newStallEngine(t)
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		roles("prefill", "decode")(i, cfg)
		[]*stallEngine{prefill, decode}[i].external(cfg)
	})
	urls := tn.URLs()
	t.Run("prefill stalls", func(t *testing.T) {
		// The decode node is the ingress: the prefill is forwarded.
		resp, b := postWithin(t, urls[1], chatBody(longPrompt("p", 800), 8, true), "300ms")
		wantEngineTimeout(t, resp, b, "no handover")
		prefill.allCancelled(t, 1)
		if decode.started.Load() != 0 {
			t.Errorf("the decode engine took %d requests, want none", decode.started.Load())
		}
	})
	t.Run("decode stalls", func(t *testing.T) {
		// The prefill node is the ingress: the prefill runs there, the decode is forwarded.
		prefill.handover.Store(true)
		resp, b := postWithin(t, urls[0], chatBody(longPrompt("d", 800), 8, false), "300ms")
		wantEngineTimeout(t, resp, b, "no first token")
		decode.allCancelled(t, 1)
		if got := prefill.prefills.Load(); got != 2 {
			t.Errorf("the prefill engine took %d prefills, want 2", got)
		}
	})
	assertReconciled(t, urls[0], 1)
	assertReconciled(t, urls[1], 1)
}

// TestRerunPastTheDeadlineGetsItsTTLAfresh: an owner whose engine gave the first token and which
// then died past the request's queue TTL leaves a rerun (a request not streamed runs whole
// again) with no wait left; the rerun gets its TTL afresh, once, and completes on the other
// candidate rather than ending in 504 engine_timeout.
func TestRerunPastTheDeadlineGetsItsTTLAfresh(t *testing.T) {
	tn := startMigrateNet(t, nil)
	urls := tn.URLs()
	// A TTL a loaded machine's rerun still meets, inside a generation long enough to be
	// killed past it.
	const ttl = time.Second
	body := genBody("/v1/chat/completions", 600, false) // about 3 s at the engine's real speed
	sent := time.Now()
	done := sendAsync(urls[0], "/v1/chat/completions", body, map[string]string{node.HeaderQueueTTL: ttl.String()})
	owner := 0
	poll.Until(t, 10*time.Second, "a candidate to run the request past its queue TTL", func() bool {
		for i := 1; i <= 2; i++ {
			if selfOf(peers(t, urls[i])).Running > 0 {
				owner = i
			}
		}
		return owner != 0 && time.Since(sent) > ttl
	})
	if err := tn.Nodes[owner].KillTransport(); err != nil {
		t.Fatal(err)
	}
	a := <-done
	if a.err != nil || a.status != http.StatusOK {
		t.Fatalf("the client got %d %s (%v) after its owner died past the queue TTL; want a complete response", a.status, a.body, a.err)
	}
	if other := tn.Nodes[3-owner].Name(); a.node != other {
		t.Errorf("answered by %q, want the other candidate %q", a.node, other)
	}
	reconciles(t, urls)
}
