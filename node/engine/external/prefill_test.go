package external

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestPrefillRateFromCounters pins how a node learns its server's prefill throughput: prompt
// tokens less cache hits per second, only over intervals in which requests waited at both
// ends (the server was doing all it could); a quiet interval keeps the figure; a configured
// rate wins.
func TestPrefillRateFromCounters(t *testing.T) {
	metrics := func(waiting int, prompt, hits float64) map[string][]sample {
		m, err := parseMetrics(strings.NewReader(fmt.Sprintf(
			"vllm:num_requests_waiting %d\nvllm:num_requests_running 4\nvllm:prompt_tokens_total %g\nvllm:prefix_cache_hits_total %g\n",
			waiting, prompt, hits)))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	t0 := time.Unix(1000, 0)
	steps := []struct {
		waiting      int
		prompt, hits float64
		want         float64
	}{
		{3, 0, 0, 0},                    // first scrape: nothing to compare with
		{3, 30000, 0, 30000},            // saturated: 30k tokens in a second
		{0, 40000, 0, 30000},            // nothing waits now: no sample, the figure stays
		{2, 45000, 0, 30000},            // waited only at this end: no sample
		{2, 85000, 20000, 30000 - 3000}, // 40k in, 20k from cache: 20k computed; EWMA 0.3
	}
	for _, cfgRate := range []float64{0, 12345} {
		e := newEngine(t, newFake(t), KindVLLM, func(c *Config) { c.PrefillTokensPerSecond = cfgRate })
		for i, st := range steps {
			if err := e.apply(t0.Add(time.Duration(i)*time.Second), metrics(st.waiting, st.prompt, st.hits)); err != nil {
				t.Fatal(err)
			}
			want := st.want
			if cfgRate > 0 {
				want = cfgRate
			}
			if got := e.State().PrefillTokensPerSecond; got != want {
				t.Errorf("configured %v, step %d: %v tokens/s, want %v", cfgRate, i, got, want)
			}
		}
	}
}
