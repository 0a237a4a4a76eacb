package loadgen

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	v := make([]float64, 100)
	for i := range v {
		v[i] = float64(i + 1)
	}
	for _, c := range []struct {
		p    float64
		want float64
	}{{0.5, 50}, {0.9, 90}, {0.99, 99}, {1, 100}, {0.001, 1}} {
		if got := Percentile(v, c.p); got != c.want {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	if Percentile(nil, 0.5) != 0 || Percentile([]float64{3}, 0.99) != 3 {
		t.Error("empty or single-sample percentile wrong")
	}
	var s samples
	for i := 100; i >= 1; i-- {
		s.add(time.Duration(i) * time.Millisecond)
	}
	got := s.summary()
	if got.Count != 100 || got.P50 != 0.05 || got.P99 != 0.099 || got.Max != 0.1 || got.Mean < 0.0504 || got.Mean > 0.0506 {
		t.Errorf("summary %+v", got)
	}
}

func TestMetSLO(t *testing.T) {
	cls := Class{Name: "x", TTFT: 100 * time.Millisecond, TPOT: 10 * time.Millisecond}
	for _, c := range []struct {
		name string
		r    Result
		tpot time.Duration
		want bool
	}{
		// 11 tokens over 100 ms after the first: TPOT 10 ms.
		{"both met at the limit", Result{Outcome: Completed, TTFT: 100 * time.Millisecond, E2E: 200 * time.Millisecond, OutputTokens: 11}, 10 * time.Millisecond, true},
		{"ttft missed", Result{Outcome: Completed, TTFT: 101 * time.Millisecond, E2E: 150 * time.Millisecond, OutputTokens: 11}, 4900 * time.Microsecond, false},
		{"tpot missed", Result{Outcome: Completed, TTFT: 10 * time.Millisecond, E2E: 121 * time.Millisecond, OutputTokens: 11}, 11100 * time.Microsecond, false},
		{"one token has no tpot", Result{Outcome: Completed, TTFT: 50 * time.Millisecond, E2E: 5 * time.Second, OutputTokens: 1}, 0, true},
		{"refused never meets", Result{Outcome: Refused}, 0, false},
		{"failed never meets", Result{Outcome: Failed, TTFT: 1}, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.r.Class = cls
			if got := c.r.TPOT(); got != c.tpot {
				t.Errorf("TPOT %v, want %v", got, c.tpot)
			}
			if got := c.r.MetSLO(); got != c.want {
				t.Errorf("MetSLO %v, want %v", got, c.want)
			}
		})
	}
}

func TestCollectorGoodputArithmetic(t *testing.T) {
	hi := Class{Name: "interactive", TTFT: 100 * time.Millisecond, TPOT: 10 * time.Millisecond}
	lo := Class{Name: "batch", Priority: -1, TTFT: time.Second, TPOT: 100 * time.Millisecond}
	ok := func(c Class, ttft time.Duration, node string) *Result {
		return &Result{Class: c, Outcome: Completed, TTFT: ttft, E2E: ttft + 9*time.Millisecond, OutputTokens: 10,
			PromptTokens: 100, CachedTokens: 25, Node: node, ITL: []time.Duration{time.Millisecond, 2 * time.Millisecond}}
	}
	c := newCollector()
	c.add(ok(hi, 50*time.Millisecond, "a"), true)
	c.add(ok(hi, 500*time.Millisecond, "b"), false) // misses the interactive TTFT SLO, ends after the window
	c.add(ok(lo, 500*time.Millisecond, "b"), true)  // meets the batch one
	c.add(&Result{Class: lo, Outcome: Refused, Status: 429, Reason: "queue_full", HasRetryAfter: true, RetryAfter: 2 * time.Second}, true)
	c.add(&Result{Class: lo, Outcome: Refused, Status: 429, Reason: "queue_full", Retried: true, HasRetryAfter: true, RetryAfter: 4 * time.Second}, true)
	c.add(&Result{Class: hi, Outcome: Refused, Status: 503, Reason: "no_capacity"}, true)
	c.add(&Result{Class: hi, Outcome: Failed, Failure: FailStream + ":engine_error"}, true)
	r := c.report(2*time.Second, 4*time.Second) // goodput is per second of the arrival window

	if r.Sent != 7 || r.Completed != 3 || r.Refused != 3 || r.Failed != 1 || r.Sent != r.Completed+r.Refused+r.Failed {
		t.Fatalf("counts sent %d completed %d refused %d failed %d", r.Sent, r.Completed, r.Refused, r.Failed)
	}
	if r.Good != 2 || r.Goodput != 1 || r.Attainment != 2.0/7 || r.OfferedRate != 3.5 {
		t.Errorf("good %d goodput %v attainment %v offered %v", r.Good, r.Goodput, r.Attainment, r.OfferedRate)
	}
	ci, cb := r.Classes["interactive"], r.Classes["batch"]
	if ci.Sent != 4 || ci.Good != 1 || ci.Attainment != 0.25 || cb.Sent != 3 || cb.Good != 1 || cb.Refused != 2 || cb.Priority != -1 {
		t.Errorf("classes %+v %+v", ci, cb)
	}
	if r.RefusalsByStatus["429"] != 2 || r.RefusalsByStatus["503"] != 1 || r.RefusalsByReason["queue_full"] != 2 || r.RefusalsByReason["no_capacity"] != 1 {
		t.Errorf("refusals %v %v", r.RefusalsByStatus, r.RefusalsByReason)
	}
	if r.Failures["stream_error:engine_error"] != 1 || r.Nodes["a"] != 1 || r.Nodes["b"] != 2 {
		t.Errorf("failures %v nodes %v", r.Failures, r.Nodes)
	}
	if r.Retried != 1 || r.RetriedCompleted != 0 || r.RetryAfterSeen != 2 || r.RetryAfterMean != 3 {
		t.Errorf("retries %d/%d retry-after %d mean %v", r.Retried, r.RetriedCompleted, r.RetryAfterSeen, r.RetryAfterMean)
	}
	if r.CachedRatio != 0.25 || r.OutputTokens != 30 || r.OutputTokensPerSec != 7.5 || r.ITL.Count != 6 || r.TPOT.Count != 3 {
		t.Errorf("tokens: cached %v out %d tok/s %v itl %d tpot %d", r.CachedRatio, r.OutputTokens, r.OutputTokensPerSec, r.ITL.Count, r.TPOT.Count)
	}
	if r.CompletedInWindow != 2 || r.OutputTokensInWindow != 20 {
		t.Errorf("in window: completed %d output tokens %d, want 2 and 20", r.CompletedInWindow, r.OutputTokensInWindow)
	}
	if k := r.Kinds[""]; k == nil || k.Sent != 7 || k.Good != 2 || len(r.Kinds) != 1 {
		t.Errorf("kinds %v", r.Kinds)
	}
	if r.TTFT.P50 != 0.5 || r.TTFT.Max != 0.5 || r.TTFT.Count != 3 {
		t.Errorf("ttft %+v", r.TTFT)
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name string
		h    map[string]string
		want time.Duration
		ok   bool
	}{
		{"seconds", map[string]string{"Retry-After": "3"}, 3 * time.Second, true},
		{"fraction", map[string]string{"Retry-After": "0.5"}, 500 * time.Millisecond, true},
		{"ms wins", map[string]string{"Retry-After": "3", "Retry-After-Ms": "250"}, 250 * time.Millisecond, true},
		{"http date", map[string]string{"Retry-After": now.Add(7 * time.Second).Format(http.TimeFormat)}, 7 * time.Second, true},
		{"none", nil, 0, false},
		{"garbage", map[string]string{"Retry-After": "soon"}, 0, false},
		{"negative", map[string]string{"Retry-After": "-1"}, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range c.h {
				h.Set(k, v)
			}
			got, ok := parseRetryAfter(h, now)
			if got != c.want || ok != c.ok {
				t.Fatalf("got %v %v, want %v %v", got, ok, c.want, c.ok)
			}
		})
	}
}

func TestConsumeStream(t *testing.T) {
	tick := time.Unix(0, 0)
	clock := func() time.Time { tick = tick.Add(time.Millisecond); return tick }
	for _, c := range []struct {
		name     string
		in       string
		chunks   int
		finished bool
		errCode  string
		decode   bool
		output   string
		usage    bool
	}{
		{"openai stream", `data: {"choices":[{"delta":{"role":"assistant"}}]}

data: {"choices":[{"delta":{"content":"he"}}]}

: keepalive
data: {"choices":[{"delta":{"content":"llo"},"finish_reason":null}]}

data: {"choices":[{"delta":{},"finish_reason":"stop"}]}

data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}

data: [DONE]

`, 2, true, "", false, "hello", true},
		{"crlf and no space", "data:{\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\r\n\r\ndata:[DONE]\r\n\r\n", 1, true, "", false, "x", false},
		{"mid-stream error", "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: {\"error\":{\"message\":\"boom\",\"code\":\"engine_failed\"}}\n\n", 1, false, "engine_failed", false, "x", false},
		{"error with type only", "data: {\"error\":{\"message\":\"boom\",\"type\":\"server_error\",\"code\":null}}\n\n", 0, false, "server_error", false, "", false},
		{"error as a string", "data: {\"error\":\"overloaded\"}\n\n", 0, false, "unknown", false, "", false},
		{"truncated", "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n", 1, false, "", false, "x", false},
		{"not json", "data: {oops\n\n", 0, false, "", true, "", false},
		// The event-stream format drops an event its input ends inside: the stream was cut.
		{"last event without blank line", "data: {\"choices\":[{\"delta\":{\"content\":\"x\"},\"finish_reason\":\"length\"}]}", 0, false, "", true, "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := consumeStream(strings.NewReader(c.in), clock)
			if st.chunks != c.chunks || st.finished != c.finished || st.errReason != c.errCode ||
				(st.decodeErr != nil) != c.decode || st.output.String() != c.output || (st.usage != nil) != c.usage {
				t.Fatalf("chunks %d finished %v err %q decode %v output %q usage %v",
					st.chunks, st.finished, st.errReason, st.decodeErr, st.output.String(), st.usage != nil)
			}
			if len(st.itl) != max(0, st.chunks-1) {
				t.Fatalf("%d inter-token gaps for %d chunks", len(st.itl), st.chunks)
			}
			if c.usage && (st.usage.CompletionTokens != 2 || st.usage.PromptTokensDetails.CachedTokens != 4) {
				t.Fatalf("usage %+v", st.usage)
			}
		})
	}
}
