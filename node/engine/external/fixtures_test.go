package external

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/node/engine"
)

// none marks a counter the fixture's engine does not export.
const none = -1.0

// TestRecordedMetrics maps each engine's recorded /metrics (testdata/*.metrics, whose headers
// cite the source of every name and label) through its kind: the state a scrape yields, and the
// block size and counters the residency model and the prefill rate read. A figure an engine
// does not export must come out as the node's own (the nominal KV size, no hit rate), not as
// a misread.
func TestRecordedMetrics(t *testing.T) {
	tests := []struct {
		file, kind string
		// want is the scraped state: waiting, running, KV blocks of 16 tokens (4096, the
		// nominal size, when the engine does not say) and, for a gauge, the hit rate.
		want engine.State
		// block is the engine's KV block size in its tokens; 0: not exported.
		block int
		// hits and queries are the prefix cache counters, prompt and cached the prefill ones.
		hits, queries, prompt, cached float64
	}{
		{file: "vllm.metrics", kind: KindVLLM,
			// 16 × 26624 tokens; 0.8125 used.
			want:  engine.State{Waiting: 6, Running: 24, KVBlocksTotal: 26624, KVBlocksUsed: 21632},
			block: 16, hits: 31338112, queries: 48213504, prompt: 48190221, cached: 31338112},
		{file: "vllm-0.8.metrics", kind: KindVLLM,
			// num_gpu_blocks="None": the nominal size; the gpu_ counters count blocks, so they
			// give the hit rate and are not subtracted from the prompt tokens.
			want:  engine.State{Waiting: 0, Running: 9, KVBlocksTotal: 4096, KVBlocksUsed: 1258},
			block: 16, hits: 688120, queries: 1203344, prompt: 19253504, cached: none},
		{file: "sglang.metrics", kind: KindSGLang,
			// The totals under priority="", not twice them; max_total_num_tokens 471104.
			want: engine.State{Waiting: 5, Running: 18, KVBlocksTotal: 29444, KVBlocksUsed: 21789,
				HitRate: 0.58},
			block: 16, hits: none, queries: none, prompt: 96511837, cached: 55012764},
		{file: "sglang-cache-info.metrics", kind: KindSGLang,
			want: engine.State{Waiting: 0, Running: 7, KVBlocksTotal: 29444, KVBlocksUsed: 6183,
				HitRate: 0.33},
			block: 1, hits: none, queries: none, prompt: 12040117, cached: 3904511},
		{file: "llamacpp.metrics", kind: KindLlamaCpp,
			want:  engine.State{Waiting: 2, Running: 4, KVBlocksTotal: 4096},
			block: 0, hits: none, queries: none, prompt: 2134570, cached: none},
		{file: "llamacpp-kv.metrics", kind: KindLlamaCpp,
			want:  engine.State{Waiting: 1, Running: 2, KVBlocksTotal: 4096, KVBlocksUsed: 1792},
			block: 0, hits: none, queries: none, prompt: 512844, cached: none},
		{file: "tgi.metrics", kind: KindTGI,
			want:  engine.State{Waiting: 3, Running: 14, KVBlocksTotal: 4096},
			block: 0, hits: none, queries: none, prompt: none, cached: none},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			text := readFixture(t, tt.file)
			m, err := parseMetrics(strings.NewReader(text))
			if err != nil {
				t.Fatal(err)
			}
			names := kinds[tt.kind]
			counters := []struct {
				what  string
				names []string
				want  float64
			}{
				{"prefix cache hits", names.hits, tt.hits},
				{"prefix cache queries", names.queries, tt.queries},
				{"prompt tokens", []string{names.prompt}, tt.prompt},
				{"cached prompt tokens", []string{names.cached}, tt.cached},
			}
			for _, c := range counters {
				got, ok := sum(m, c.names...)
				if !ok {
					got = none
				}
				if got != c.want {
					t.Errorf("%s: %v, want %v", c.what, got, c.want)
				}
			}
			if got := engineBlockTokens(m, tt.kind); got != tt.block {
				t.Errorf("engine block: %d tokens, want %d", got, tt.block)
			}

			f := newFake(t)
			f.set(text)
			got := newEngine(t, f, tt.kind, nil).State()
			want := tt.want
			want.Healthy, want.BlockTokens, want.MaxRunning = true, 16, 256
			if !reflect.DeepEqual(got, want) {
				t.Errorf("state\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

func readFixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// FuzzParseMetrics: any exposition parses without panicking, and a family that has a total
// under priority="" keeps no per-priority series beside it.
func FuzzParseMetrics(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.metrics"))
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseMetrics(strings.NewReader(string(b)))
		if err != nil {
			return // a line over the scanner's limit
		}
		for name, ss := range m {
			for _, s := range ss {
				if v := s.labels[breakdownLabel]; v != "" && slices.ContainsFunc(ss, isTotal) {
					t.Fatalf("%s keeps the priority=%q series beside its total", name, v)
				}
			}
		}
	})
}
