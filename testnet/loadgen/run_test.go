package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// step scripts one response of the fake server.
type step struct {
	status     int    // 0 = 200 with a stream
	reason     string // X-Kvmesh-Reason
	code       string // error body code
	retryAfter string // Retry-After-Ms
	ttft, gap  time.Duration
	tokens     int
	midError   string // an error event after the tokens
	truncate   bool   // end the stream without finishing it
	hangup     bool   // close the connection without a response
	node       string
	prefill    string // X-Kvmesh-Prefill-Node
	cachedPct  int
	output     string // content of every token chunk (default "tok ")
	ttftTarget string // X-Kvmesh-TTFT-Target, the target the mesh declares
}

type captured struct {
	req    chatRequest
	header http.Header
}

// fake is an OpenAI-compatible server that answers as script says.
type fake struct {
	srv      *httptest.Server
	mu       sync.Mutex
	got      []captured
	inflight atomic.Int64
	maxIn    atomic.Int64
}

// pause waits d or until ctx ends: the fake's scripted latency.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func newFake(t *testing.T, script func(n int, req chatRequest) step, counter *atomic.Int64) *fake {
	t.Helper()
	if counter == nil {
		counter = new(atomic.Int64)
	}
	f := &fake{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cur := f.inflight.Add(1)
		defer f.inflight.Add(-1)
		for m := f.maxIn.Load(); cur > m && !f.maxIn.CompareAndSwap(m, cur); m = f.maxIn.Load() {
		}
		var req chatRequest
		if r.URL.Path != "/v1/chat/completions" || json.NewDecoder(r.Body).Decode(&req) != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		n := int(counter.Add(1) - 1)
		f.mu.Lock()
		f.got = append(f.got, captured{req: req, header: r.Header.Clone()})
		f.mu.Unlock()
		s := script(n, req)
		if s.hangup {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		if s.node != "" {
			w.Header().Set("X-Kvmesh-Node", s.node)
		}
		if s.prefill != "" {
			w.Header().Set("X-Kvmesh-Prefill-Node", s.prefill)
		}
		if s.ttftTarget != "" {
			w.Header().Set("X-Kvmesh-TTFT-Target", s.ttftTarget)
		}
		if s.status != 0 {
			if s.reason != "" {
				w.Header().Set("X-Kvmesh-Reason", s.reason)
			}
			if s.retryAfter != "" {
				w.Header().Set("Retry-After-Ms", s.retryAfter)
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(s.status)
			fmt.Fprintf(w, `{"error":{"message":"no","type":"overloaded","param":null,"code":%q}}`, s.code)
			return
		}
		prompt := 0
		for _, m := range req.Messages {
			prompt += len(m.Content) / bytesPerToken
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		fl := w.(http.Flusher)
		fl.Flush()
		if !pause(r.Context(), s.ttft) {
			return
		}
		out := s.output
		if out == "" {
			out = "tok "
		}
		for i := range s.tokens {
			if i > 0 && !pause(r.Context(), s.gap) {
				return
			}
			b, _ := json.Marshal(out)
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%s}}]}\n\n", b)
			fl.Flush()
		}
		if s.midError != "" {
			fmt.Fprintf(w, "data: {\"error\":{\"message\":\"engine died\",\"type\":\"server_error\",\"code\":%q}}\n\n", s.midError)
			return
		}
		if s.truncate {
			return
		}
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n")
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n",
			prompt, s.tokens, prompt*s.cachedPct/100)
		fmt.Fprintf(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fake) requests() []captured {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]captured(nil), f.got...)
}

func runCfg(workload string, targets ...string) Config {
	cfg := DefaultConfig()
	cfg.Targets, cfg.Workload = targets, workload
	cfg.Rate, cfg.Duration = 2000, 0
	cfg.Timeout = 10 * time.Second
	cfg.ToolWait = time.Millisecond
	return cfg
}

func mustRun(t *testing.T, cfg Config) *Report {
	t.Helper()
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if rep.Sent != rep.Completed+rep.Refused+rep.Failed {
		t.Fatalf("counts do not reconcile: sent %d ≠ %d + %d + %d", rep.Sent, rep.Completed, rep.Refused, rep.Failed)
	}
	return rep
}

func TestRunAccountingReconciles(t *testing.T) {
	var n atomic.Int64
	script := func(n int, _ chatRequest) step {
		switch n % 6 {
		case 0:
			return step{tokens: 3, node: "n1", prefill: "n0"}
		case 1:
			return step{status: 429, reason: "queue_full", code: "ignored_when_header_set"}
		case 2:
			return step{status: 503, code: "no_capacity"}
		case 3:
			return step{tokens: 2, midError: "engine_failed"}
		case 4:
			return step{tokens: 2, truncate: true}
		default:
			return step{hangup: true}
		}
	}
	a, b := newFake(t, script, &n), newFake(t, script, &n)
	cfg := runCfg("chat", a.srv.URL, b.srv.URL)
	cfg.MaxRequests = 60
	var progress, records bytes.Buffer
	cfg.Progress, cfg.ProgressInterval = &progress, time.Millisecond
	cfg.Requests, cfg.RunLabel = &records, "chat@1"
	var mu sync.Mutex
	observed := map[string]int{}
	cfg.Observe = func(r RequestRecord) { mu.Lock(); observed[r.Outcome]++; mu.Unlock() }
	rep := mustRun(t, cfg)

	if got := len(a.requests()) + len(b.requests()); rep.Sent != 60 || got != 60 {
		t.Fatalf("sent %d, servers saw %d, want 60", rep.Sent, got)
	}
	if len(a.requests()) != 30 || len(b.requests()) != 30 {
		t.Errorf("round robin: %d and %d", len(a.requests()), len(b.requests()))
	}
	want := map[string]int{"completed": 10, "refused": 20, "failed": 30}
	got := map[string]int{"completed": rep.Completed, "refused": rep.Refused, "failed": rep.Failed}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("outcomes %v, want %v", got, want)
	}
	if rep.RefusalsByStatus["429"] != 10 || rep.RefusalsByStatus["503"] != 10 ||
		rep.RefusalsByReason["queue_full"] != 10 || rep.RefusalsByReason["no_capacity"] != 10 {
		t.Errorf("refusals %v %v", rep.RefusalsByStatus, rep.RefusalsByReason)
	}
	if rep.Failures["stream_error:engine_failed"] != 10 || rep.Failures[FailTruncated] != 10 || rep.Failures[FailTransport] != 10 {
		t.Errorf("failures %v", rep.Failures)
	}
	if rep.Nodes["n1"] != 10 || rep.OutputTokens != 30 {
		t.Errorf("nodes %v, output tokens %d", rep.Nodes, rep.OutputTokens)
	}
	if s := progress.String(); !strings.Contains(s, "sent 60") || !strings.Contains(s, "refused 20") || !strings.HasSuffix(s, "\n") {
		t.Errorf("progress line %q", s)
	}
	// One record per request, agreeing with the report.
	recs := map[string]int{}
	dec := json.NewDecoder(&records)
	for dec.More() {
		var r RequestRecord
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("record %d: %v", len(recs), err)
		}
		if r.Run != "chat@1" || r.Kind != KindChat || r.EndS <= 0 || r.PlannedPromptTokens <= 0 || r.MaxTokens <= 0 {
			t.Fatalf("record %+v", r)
		}
		key := r.Outcome
		switch {
		case r.Outcome == "completed" && (r.Node != "n1" || r.PrefillNode != "n0" || r.OutputTokens != 3 || r.E2ES < r.TTFTS):
			t.Fatalf("completed record %+v", r)
		case r.Outcome != "completed" && r.PrefillNode != "":
			t.Fatalf("record %+v names a prefill node", r)
		case r.Outcome == "refused":
			key += fmt.Sprintf(":%d:%s", r.Status, r.Reason)
		case r.Outcome == "failed":
			key += ":" + r.Failure
		}
		recs[key]++
	}
	wantRecs := map[string]int{"completed": 10, "refused:429:queue_full": 10, "refused:503:no_capacity": 10,
		"failed:stream_error:engine_failed": 10, "failed:" + FailTruncated: 10, "failed:" + FailTransport: 10}
	if fmt.Sprint(recs) != fmt.Sprint(wantRecs) {
		t.Errorf("records %v, want %v", recs, wantRecs)
	}
	if fmt.Sprint(observed) != fmt.Sprint(want) {
		t.Errorf("Observe saw %v, want %v", observed, want)
	}
}

// TestRunSendsTheAPIKey pins that every request carries APIKey as its bearer token.
func TestRunSendsTheAPIKey(t *testing.T) {
	f := newFake(t, func(int, chatRequest) step { return step{tokens: 1} }, nil)
	cfg := runCfg("chat", f.srv.URL)
	cfg.MaxRequests, cfg.APIKey = 3, "sk-test"
	mustRun(t, cfg)
	got := f.requests()
	if len(got) != 3 {
		t.Fatalf("%d requests, want 3", len(got))
	}
	for _, c := range got {
		if a := c.header.Get("Authorization"); a != "Bearer sk-test" {
			t.Errorf("Authorization %q", a)
		}
	}
}

// TestProgressIsOneLinePerUpdateOffATerminal pins that progress written to a file (a log, a CI
// job) has a line per update and no carriage returns, which would pile every update into one
// line there.
func TestProgressIsOneLinePerUpdateOffATerminal(t *testing.T) {
	f := newFake(t, func(int, chatRequest) step { return step{tokens: 2, gap: time.Millisecond} }, nil)
	cfg := runCfg("chat", f.srv.URL)
	cfg.MaxRequests = 20
	cfg.Rate = 1000
	out, err := os.Create(filepath.Join(t.TempDir(), "progress"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cfg.Progress, cfg.ProgressInterval = out, time.Millisecond
	mustRun(t, cfg)
	b, err := os.ReadFile(out.Name())
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if strings.Contains(s, "\r") || !strings.HasSuffix(s, "\n") {
		t.Fatalf("progress off a terminal %q: want lines without carriage returns", s)
	}
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	for _, l := range lines {
		if !strings.HasPrefix(l, "[") || !strings.Contains(l, " sent ") {
			t.Errorf("progress line %q", l)
		}
	}
	if last := lines[len(lines)-1]; !strings.Contains(last, "sent 20 ") {
		t.Errorf("final progress line %q", last)
	}
}

// TestRunRequestRecordsWriteError: a Requests writer that fails does not stop the run; Run
// returns the report and the first write error.
func TestRunRequestRecordsWriteError(t *testing.T) {
	f := newFake(t, func(int, chatRequest) step { return step{tokens: 2} }, nil)
	cfg := runCfg("chat", f.srv.URL)
	cfg.MaxRequests = 5
	cfg.Requests = failingWriter{}
	rep, err := Run(context.Background(), cfg)
	if rep == nil || rep.Completed != 5 || err == nil || !errors.Is(err, errDiskFull) {
		t.Fatalf("Run = %+v, %v; want 5 completed and the write error", rep, err)
	}
}

var errDiskFull = errors.New("disk full")

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errDiskFull }

func TestRunSLOMetAndMissed(t *testing.T) {
	f := newFake(t, func(int, chatRequest) step {
		return step{ttft: 30 * time.Millisecond, gap: time.Millisecond, tokens: 5, cachedPct: 50}
	}, nil)
	cfg := runCfg("chat", f.srv.URL)
	cfg.MaxRequests = 20
	cfg.Interactive = Class{Name: "interactive", TTFT: 10 * time.Millisecond, TPOT: time.Minute}
	cfg.Batch = Class{Name: "batch", Priority: -1, TTFT: time.Minute, TPOT: time.Minute}
	rep := mustRun(t, cfg)
	ci, cb := rep.Classes["interactive"], rep.Classes["batch"]
	if ci == nil || cb == nil || ci.Completed == 0 || cb.Completed == 0 {
		t.Fatalf("want both classes completed, got %+v %+v", ci, cb)
	}
	// The server's first token takes ≥ 30 ms: a 10 ms TTFT SLO is always missed, a minute met.
	if ci.Good != 0 || cb.Good != cb.Completed || rep.Good != cb.Good {
		t.Errorf("good: interactive %d, batch %d of %d, total %d", ci.Good, cb.Good, cb.Completed, rep.Good)
	}
	if rep.TTFT.P50 < 0.030 || rep.TPOT.P50 < 0.001 || rep.E2E.P50 < rep.TTFT.P50 {
		t.Errorf("ttft %+v tpot %+v e2e %+v", rep.TTFT, rep.TPOT, rep.E2E)
	}
	if k := rep.Kinds[KindChat]; k == nil || len(rep.Kinds) != 1 || k.Sent != rep.Sent || k.Good != rep.Good {
		t.Errorf("kinds %v", rep.Kinds)
	}
	if rep.ITL.Count != 4*rep.Completed || rep.OutputTokens != 5*rep.Completed {
		t.Errorf("itl samples %d, output tokens %d for %d completed", rep.ITL.Count, rep.OutputTokens, rep.Completed)
	}
	if rep.CachedRatio < 0.49 || rep.CachedRatio > 0.5 {
		t.Errorf("cached ratio %v, want 0.5", rep.CachedRatio)
	}
	prios := map[string]string{}
	for _, c := range f.requests() {
		prios[c.header.Get("X-Kvmesh-Priority")] = c.header.Get("X-Kvmesh-TTFT-SLO")
		if !c.req.Stream || !c.req.StreamOptions.IncludeUsage || c.req.Model != "sim" || c.req.MaxTokens < 1 || !c.req.IgnoreEOS {
			t.Fatalf("request %+v", c.req)
		}
	}
	if prios["normal"] != "10ms" || prios["-1"] != "1m0s" || len(prios) != 2 {
		t.Errorf("priority → TTFT SLO headers %v", prios)
	}
}

// TestRunFittedTTFT: with FittedTTFT no TTFT header is sent and a request is judged by the
// target the server declares, not its class's: a 10 ms class target is missed by every
// request, a declared minute met.
func TestRunFittedTTFT(t *testing.T) {
	f := newFake(t, func(n int, _ chatRequest) step {
		s := step{ttft: 30 * time.Millisecond, tokens: 2}
		if n%2 == 0 {
			s.ttftTarget = "1m0s"
		}
		return s
	}, nil)
	cfg := runCfg("chat", f.srv.URL)
	cfg.MaxRequests, cfg.Concurrency = 10, 1
	cfg.FittedTTFT = true
	cfg.Interactive = Class{Name: "interactive", TTFT: 10 * time.Millisecond, TPOT: time.Minute}
	cfg.Batch = Class{Name: "batch", Priority: -1, TTFT: 10 * time.Millisecond, TPOT: time.Minute}
	rep := mustRun(t, cfg)
	if rep.Completed != 10 || rep.Good != 5 {
		t.Errorf("completed %d, good %d: want 10 and the 5 with a declared minute", rep.Completed, rep.Good)
	}
	for _, c := range f.requests() {
		if c.header.Get("X-Kvmesh-TTFT-SLO") != "" || c.header.Get("X-Kvmesh-TPOT-SLO") != "1m0s" {
			t.Fatalf("headers sent: TTFT %q, TPOT %q; want none and the class's", c.header.Get("X-Kvmesh-TTFT-SLO"), c.header.Get("X-Kvmesh-TPOT-SLO"))
		}
	}
}

func TestRunHonoursRetryAfter(t *testing.T) {
	for _, retries := range []int{0, 1} {
		t.Run(fmt.Sprint("retries ", retries), func(t *testing.T) {
			var mu sync.Mutex
			seen := map[string]bool{}
			f := newFake(t, func(_ int, req chatRequest) step {
				mu.Lock()
				defer mu.Unlock()
				key := req.Messages[len(req.Messages)-1].Content
				if !seen[key] {
					seen[key] = true
					return step{status: 429, reason: "queue_full", retryAfter: "30"}
				}
				return step{tokens: 2}
			}, nil)
			cfg := runCfg("chat", f.srv.URL)
			cfg.MaxRequests, cfg.Retries = 8, retries
			rep := mustRun(t, cfg)
			if rep.Sent != 8 || len(f.requests()) != 8*(1+retries) {
				t.Fatalf("sent %d, server saw %d", rep.Sent, len(f.requests()))
			}
			if retries == 0 {
				if rep.Refused != 8 || rep.Retried != 0 || rep.RetryAfterSeen != 8 || rep.RetryAfterMean != 0.03 {
					t.Errorf("refused %d retried %d retry-after %d %v", rep.Refused, rep.Retried, rep.RetryAfterSeen, rep.RetryAfterMean)
				}
				return
			}
			if rep.Completed != 8 || rep.Retried != 8 || rep.RetriedCompleted != 8 {
				t.Errorf("completed %d retried %d retried-completed %d", rep.Completed, rep.Retried, rep.RetriedCompleted)
			}
			// Latency counts from the first attempt, so it includes the honoured wait.
			if rep.TTFT.P50 < 0.030 {
				t.Errorf("ttft p50 %v does not include the 30 ms Retry-After", rep.TTFT.P50)
			}
		})
	}
}

// render is kvmesh's chat rendering (kvindex.RenderChat), restated so the test can check
// prefix growth in the unit the mesh hashes.
func render(msgs []Message) string {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString("<|" + m.Role + "|>\n" + m.Content + "\n")
	}
	return b.String() + "<|assistant|>\n"
}

func TestAgentSessionsGrowTheirPrefix(t *testing.T) {
	f := newFake(t, func(n int, _ chatRequest) step {
		return step{tokens: 2, output: fmt.Sprintf("answer%d ", n)}
	}, nil)
	cfg := runCfg("agents", f.srv.URL)
	cfg.Rate, cfg.MaxRequests = 500, 40
	rep := mustRun(t, cfg)
	plan := mustPlan(t, cfg)
	steps := map[string]int{}
	for _, it := range plan {
		steps[it.Agent.ID] = it.Agent.Steps
	}
	sessions := map[string][]captured{}
	for _, c := range f.requests() {
		id := c.header.Get("X-Kvmesh-Agent")
		if _, ok := steps[id]; !ok {
			t.Fatalf("request with unknown agent id %q", id)
		}
		sessions[id] = append(sessions[id], c)
	}
	if rep.Sent != 40 || rep.Completed != 40 || len(f.requests()) != 40 {
		t.Fatalf("sent %d completed %d, server saw %d", rep.Sent, rep.Completed, len(f.requests()))
	}
	grown, finals := 0, 0
	for id, reqs := range sessions {
		if len(reqs) > steps[id] {
			t.Fatalf("session %s sent %d steps, planned %d", id, len(reqs), steps[id])
		}
		// Only the planned last step says it is the last.
		for i, c := range reqs {
			final := c.header.Get("X-Kvmesh-Agent-Final") == "1"
			if final != (i == steps[id]-1) {
				t.Fatalf("session %s step %d of %d: final header %v", id, i, steps[id], final)
			}
			if final {
				finals++
			}
		}
		for i := 1; i < len(reqs); i++ {
			prev, next := reqs[i-1].req.Messages, reqs[i].req.Messages
			if len(next) != len(prev)+2 || !strings.HasPrefix(render(next), render(prev)[:len(render(prev))-len("<|assistant|>\n")]) {
				t.Fatalf("session %s step %d does not extend step %d", id, i, i-1)
			}
			a, tool := next[len(next)-2], next[len(next)-1]
			if a.Role != "assistant" || !strings.HasPrefix(a.Content, "answer") || strings.Count(a.Content, "answer") != 2 {
				t.Fatalf("step %d: assistant message %q is not the previous output", i, a.Content)
			}
			if tool.Role != "tool" || len(tool.Content) < 100*bytesPerToken {
				t.Fatalf("step %d: tool message %q", i, tool.Role)
			}
			grown++
		}
	}
	if grown == 0 {
		t.Fatal("no session reached a second step")
	}
	if finals == 0 {
		t.Fatal("no session sent its last step")
	}
	// Nothing came from cache, so every later step prefilled its earlier context again.
	if rep.RecomputedTokens <= 0 {
		t.Fatalf("recomputed tokens %d with no cache hits, want > 0", rep.RecomputedTokens)
	}
	g := newFake(t, func(int, chatRequest) step { return step{tokens: 2, cachedPct: 100} }, nil)
	cfg = runCfg("agents", g.srv.URL)
	cfg.Rate, cfg.MaxRequests = 500, 20
	if rep := mustRun(t, cfg); rep.RecomputedTokens != 0 || rep.Completed == 0 {
		t.Fatalf("recomputed %d tokens (completed %d) with every prompt token cached, want 0", rep.RecomputedTokens, rep.Completed)
	}
}

func TestRunTimeoutAndCancel(t *testing.T) {
	f := newFake(t, func(int, chatRequest) step { return step{ttft: time.Minute, tokens: 1} }, nil)
	cfg := runCfg("chat", f.srv.URL)
	cfg.MaxRequests, cfg.Timeout = 3, 20*time.Millisecond
	rep := mustRun(t, cfg)
	if rep.Failed != 3 || rep.Failures[FailTimeout] != 3 {
		t.Fatalf("failed %d %v, want 3 timeouts", rep.Failed, rep.Failures)
	}

	// Cancel once the server holds every request, so all of them were sent.
	held := make(chan struct{})
	g := newFake(t, func(n int, _ chatRequest) step {
		if n == 2 {
			close(held)
		}
		return step{ttft: time.Minute, tokens: 1}
	}, nil)
	cfg = runCfg("chat", g.srv.URL)
	cfg.MaxRequests = 3
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-held
		cancel()
	}()
	rep, err := Run(ctx, cfg)
	if !errors.Is(err, context.Canceled) || rep == nil {
		t.Fatalf("got %v, want context.Canceled with a report", err)
	}
	if rep.Sent != 3 || rep.Failures[FailCanceled] != 3 {
		t.Fatalf("sent %d failures %v", rep.Sent, rep.Failures)
	}
}

func TestRunConcurrencyCap(t *testing.T) {
	f := newFake(t, func(int, chatRequest) step { return step{ttft: 5 * time.Millisecond, tokens: 1} }, nil)
	cfg := runCfg("chat", f.srv.URL)
	cfg.MaxRequests, cfg.Concurrency = 12, 2
	rep := mustRun(t, cfg)
	if rep.Completed != 12 {
		t.Fatalf("completed %d", rep.Completed)
	}
	if m := f.maxIn.Load(); m > 2 || m < 1 {
		t.Fatalf("server saw %d requests at once, cap 2", m)
	}
}

func TestRunSessionsClosedLoop(t *testing.T) {
	var mu sync.Mutex
	open, maxOpen, seen := 0, 0, map[string]bool{}
	f := newFake(t, func(int, chatRequest) step { return step{tokens: 2} }, nil)
	inner := f.srv.Config.Handler
	counting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, final := r.Header.Get("X-Kvmesh-Agent"), r.Header.Get("X-Kvmesh-Agent-Final") == "1"
		mu.Lock()
		if !seen[id] {
			seen[id] = true
			open++
			maxOpen = max(maxOpen, open)
		}
		mu.Unlock()
		inner.ServeHTTP(w, r)
		if final {
			mu.Lock()
			open--
			mu.Unlock()
		}
	}))
	t.Cleanup(counting.Close)
	cfg := runCfg("agents", counting.URL)
	// About 30 sessions planned over 10 minutes: a closed loop starts each as one ends, so
	// the run takes as long as the sessions do, not the planned arrivals.
	cfg.Rate, cfg.Duration, cfg.Sessions = 0.3, 10*time.Minute, 3
	plan := mustPlan(t, cfg)
	steps := 0
	for _, it := range plan {
		steps += it.Agent.Steps
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("Run: %v (a closed loop must not wait for the planned arrivals)", err)
	}
	if len(plan) <= cfg.Sessions || rep.Completed != steps || len(seen) != len(plan) {
		t.Fatalf("%d sessions of %d steps planned; completed %d steps of %d sessions", len(plan), steps, rep.Completed, len(seen))
	}
	if maxOpen != cfg.Sessions {
		t.Fatalf("at most %d sessions ran at once, want %d", maxOpen, cfg.Sessions)
	}
	if rep.Window != cfg.Duration.Seconds() || rep.CompletedInWindow != rep.Completed {
		t.Fatalf("window %vs, completed in it %d of %d", rep.Window, rep.CompletedInWindow, rep.Completed)
	}
	for _, bad := range []func(*Config){
		func(c *Config) { c.Workload = "chat" },
		func(c *Config) { c.Duration, c.MaxRequests = 0, 10 },
		func(c *Config) { c.Sessions = -1 },
	} {
		c := cfg
		bad(&c)
		if _, err := Run(ctx, c); !errors.Is(err, ErrConfig) {
			t.Errorf("Run(%+v) = %v, want ErrConfig", c.Sessions, err)
		}
	}
}

func TestRunTraceReplay(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.jsonl")
	trace := `{"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [5, 6]}
{"timestamp": 10, "input_length": 1100, "output_length": 2, "hash_ids": [5, 6, 7]}
{"timestamp": 20, "input_length": 300, "output_length": 1, "hash_ids": [8]}
`
	if err := os.WriteFile(path, []byte(trace), 0o600); err != nil {
		t.Fatal(err)
	}
	f := newFake(t, func(_ int, req chatRequest) step { return step{tokens: req.MaxTokens} }, nil)
	cfg := runCfg("", f.srv.URL)
	cfg.Trace, cfg.Rate, cfg.Speedup = path, 0, 10
	rep := mustRun(t, cfg)
	if rep.Sent != 3 || rep.Completed != 3 || rep.OutputTokens != 7 || !strings.HasPrefix(rep.Workload, "trace:") {
		t.Fatalf("sent %d completed %d output %d workload %q", rep.Sent, rep.Completed, rep.OutputTokens, rep.Workload)
	}
	byLen := map[int]string{}
	for _, c := range f.requests() {
		byLen[len(c.req.Messages[0].Content)] = c.req.Messages[0].Content
	}
	a, b := byLen[1024*bytesPerToken], byLen[1100*bytesPerToken]
	if a == "" || b == "" || !strings.HasPrefix(b, a) {
		t.Fatal("trace requests sharing hash ids 5, 6 do not share their text")
	}

	if rep.TraceEnded {
		t.Error("a replay of the whole trace (no duration) reports it ran out")
	}

	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	if err := os.WriteFile(bad, []byte(trace+"{\"timestamp\": 30}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Trace = bad
	if _, err := Run(context.Background(), cfg); !errors.Is(err, ErrTrace) || !strings.Contains(err.Error(), "line 4") {
		t.Fatalf("malformed trace: got %v", err)
	}
}

// TestRunTraceRunsOut pins that a report says when the trace ran out of requests before the
// duration asked for, so a short window is not taken for the run's.
func TestRunTraceRunsOut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.jsonl")
	trace := `{"timestamp": 0, "input_length": 10, "output_length": 1}
{"timestamp": 20, "input_length": 10, "output_length": 1}
{"timestamp": 60000, "input_length": 10, "output_length": 1}
`
	if err := os.WriteFile(path, []byte(trace), 0o600); err != nil {
		t.Fatal(err)
	}
	f := newFake(t, func(_ int, req chatRequest) step { return step{tokens: req.MaxTokens} }, nil)
	for _, c := range []struct {
		duration time.Duration
		max      int
		sent     int
		ended    bool
	}{
		{30 * time.Millisecond, 0, 2, false}, // cut by the duration
		{2 * time.Minute, 1, 1, false},       // cut by max requests
		{2 * time.Minute, 0, 3, true},
	} {
		cfg := runCfg("", f.srv.URL)
		cfg.Trace, cfg.Rate, cfg.Speedup, cfg.Duration, cfg.MaxRequests = path, 0, 1000, c.duration, c.max
		rep := mustRun(t, cfg)
		var table strings.Builder
		if err := rep.WriteTable(&table); err != nil {
			t.Fatal(err)
		}
		if rep.Sent != c.sent || rep.TraceEnded != c.ended || strings.Contains(table.String(), "ran out") != c.ended {
			t.Errorf("duration %v, max %d: sent %d, trace ended %v, want %d, %v:\n%s", c.duration, c.max, rep.Sent, rep.TraceEnded, c.sent, c.ended, table.String())
		}
	}
}

// TestRunModels pins Config.Models: every turn of a conversation asks for one model, both
// models are asked for, a request counts as entering through its own model's node exactly
// when the target it was sent to serves its model, and the report breaks the run down by
// entry (the fakes cache half of a prompt of their own model and a tenth of another's).
func TestRunModels(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.jsonl")
	var trace strings.Builder
	const conversations, turns = 10, 4
	for i := range conversations * turns {
		fmt.Fprintf(&trace, `{"timestamp": %d, "input_length": 1100, "output_length": 2, "hash_ids": [0, %d, %d]}`+"\n", i, 100+i%conversations, 1000+i)
	}
	if err := os.WriteFile(path, []byte(trace.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	models := []string{"model-a", "model-b"}
	var fakes []*fake
	var targets []string
	mt := []ModelTargets{{Name: models[0]}, {Name: models[1]}}
	for i := range 4 {
		serves := models[i%2]
		f := newFake(t, func(_ int, req chatRequest) step {
			pct := 10
			if req.Model == serves {
				pct = 50
			}
			return step{tokens: req.MaxTokens, cachedPct: pct}
		}, nil)
		fakes = append(fakes, f)
		targets = append(targets, f.srv.URL)
		mt[i%2].Targets = append(mt[i%2].Targets, f.srv.URL)
	}
	cfg := runCfg("", targets...)
	cfg.Trace, cfg.Rate, cfg.Speedup, cfg.Models = path, 0, 1000, mt
	var records bytes.Buffer
	cfg.Requests = &records
	rep := mustRun(t, cfg)

	byConversation := map[string]string{} // hash id 1's text → model
	ownSent := 0
	for i, f := range fakes {
		for _, c := range f.requests() {
			conv := c.req.Messages[0].Content[:2*MooncakeBlockTokens*bytesPerToken]
			if m, ok := byConversation[conv]; ok && m != c.req.Model {
				t.Fatalf("a conversation asked for %s and %s", m, c.req.Model)
			}
			byConversation[conv] = c.req.Model
			if c.req.Model == models[i%2] {
				ownSent++
			}
		}
	}
	asked := map[string]int{}
	for _, m := range byConversation {
		asked[m]++
	}
	if len(byConversation) != conversations || len(asked) != 2 {
		t.Fatalf("%d conversations asked for models %v, want %d over both", len(byConversation), asked, conversations)
	}
	own, other := rep.Entries[EntryOwn], rep.Entries[EntryOther]
	if own == nil || other == nil || own.Sent != ownSent || own.Sent+other.Sent != rep.Sent || rep.Sent != conversations*turns {
		t.Fatalf("entries %+v / %+v of %d sent, want %d own", own, other, rep.Sent, ownSent)
	}
	if own.CachedRatio < 0.49 || own.CachedRatio > 0.51 || other.CachedRatio < 0.09 || other.CachedRatio > 0.11 {
		t.Errorf("cached ratios own %.3f other %.3f, want 0.5 and 0.1", own.CachedRatio, other.CachedRatio)
	}
	entries := map[string]int{}
	for dec := json.NewDecoder(&records); dec.More(); {
		var r RequestRecord
		if err := dec.Decode(&r); err != nil {
			t.Fatal(err)
		}
		if r.Model == "" {
			t.Fatalf("record %+v names no model", r)
		}
		entries[r.Entry]++
	}
	if entries[EntryOwn] != own.Sent || entries[EntryOther] != other.Sent {
		t.Errorf("records by entry %v, report own %d other %d", entries, own.Sent, other.Sent)
	}
	var table strings.Builder
	if err := rep.WriteTable(&table); err != nil || !strings.Contains(table.String(), "entry") {
		t.Errorf("table lacks the entries (%v):\n%s", err, table.String())
	}

	for name, bad := range map[string][]ModelTargets{
		"repeated name":    {{Name: "a", Targets: targets[:1]}, {Name: "a", Targets: targets[1:2]}},
		"no targets":       {{Name: "a"}},
		"unknown target":   {{Name: "a", Targets: []string{"http://127.0.0.1:1"}}},
		"empty model name": {{Targets: targets[:1]}},
	} {
		c := cfg
		c.Models = bad
		if _, err := Run(context.Background(), c); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: Run = %v, want ErrConfig", name, err)
		}
	}
}
