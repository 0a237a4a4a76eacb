package loadgen

import (
	"strings"
	"testing"
	"time"
)

// BenchmarkMooncakePrompt measures building one average Mooncake prompt (24 blocks, ~12k
// tokens) from hash ids: the text cost a replay pays per request.
func BenchmarkMooncakePrompt(b *testing.B) {
	ids := make([]int64, 24)
	for i := range ids {
		ids[i] = int64(i)
	}
	cfg := planCfg("", 1, 0, 1)
	it := TraceItems(cfg, []TraceRecord{{InputTokens: 12035, OutputTokens: 343, HashIDs: ids}})[0]
	b.SetBytes(int64(it.PromptTokens * bytesPerToken))
	for b.Loop() {
		_ = it.Messages()
	}
}

// BenchmarkConsumeStream measures parsing a 256-token SSE stream, reported per token.
func BenchmarkConsumeStream(b *testing.B) {
	var s strings.Builder
	for range 256 {
		s.WriteString(`data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok "},"finish_reason":null}]}` + "\n\n")
	}
	s.WriteString(`data: {"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":256,"prompt_tokens_details":{"cached_tokens":50}}}` + "\n\ndata: [DONE]\n\n")
	in := s.String()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		if st := consumeStream(strings.NewReader(in), time.Now); st.chunks != 256 || !st.finished {
			b.Fatal("bad parse")
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*256), "ns/token")
}

// BenchmarkCollectorAdd measures accounting one completed request with 64 inter-token gaps.
func BenchmarkCollectorAdd(b *testing.B) {
	c := newCollector()
	r := &Result{Class: DefaultInteractive, Outcome: Completed, TTFT: time.Millisecond, E2E: 10 * time.Millisecond,
		OutputTokens: 65, ITL: make([]time.Duration, 64), Node: "n1"}
	for b.Loop() {
		c.add(r, true)
	}
}

// BenchmarkPlan measures planning a 10-minute mixed workload at 100 req/s.
func BenchmarkPlan(b *testing.B) {
	cfg := planCfg("mixed", 100, 10*time.Minute, 1)
	n := 0
	for b.Loop() {
		items, err := Plan(cfg)
		if err != nil {
			b.Fatal(err)
		}
		n = len(items)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/request")
}
