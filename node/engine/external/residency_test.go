package external

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node/engine"
)

// prefixLog records what the residency model published through OnPrefix.
type prefixLog struct {
	mu              sync.Mutex
	stored, evicted []uint64
	anchors         int // stored anchors, less evicted ones
}

func (l *prefixLog) on(d kvindex.CacheDelta) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stored = append(l.stored, d.Stored...)
	l.evicted = append(l.evicted, d.Evicted...)
	l.anchors += len(d.StoredAnchors) - len(d.EvictedAnchors)
}

// take returns what was published since the last take.
func (l *prefixLog) take() (stored, evicted []uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	stored, evicted = l.stored, l.evicted
	l.stored, l.evicted = nil, nil
	return stored, evicted
}

// reply answers a generation with one token and a usage of prompt tokens, cached of them
// cached (-1: no prompt_tokens_details, as vLLM without --enable-prompt-tokens-details).
func reply(prompt, cached int) http.HandlerFunc {
	details := ""
	if cached >= 0 {
		details = fmt.Sprintf(`,"prompt_tokens_details":{"cached_tokens":%d}`, cached)
	}
	return func(w http.ResponseWriter, r *http.Request) {
		sse(w, `{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"length"}]}`,
			fmt.Sprintf(`{"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":1,"total_tokens":%d%s}}`, prompt, prompt+1, details),
			"[DONE]")
	}
}

func (f *fake) setGen(h http.HandlerFunc) {
	f.mu.Lock()
	f.gen = h
	f.mu.Unlock()
}

// chain is a prompt's full blocks, hashes base .. base+n-1 (see package residency's tests).
func chain(base uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = base + uint64(i)
	}
	return out
}

// request is a chat request for a prompt of n full 16-token blocks and 2 more tokens.
func request(blocks []uint64) *engine.Request {
	return &engine.Request{ID: "r", Endpoint: engine.Chat, Model: "a", Prompt: []byte("p"), MaxTokens: 1,
		PromptTokens: len(blocks)*16 + 2, Blocks: blocks}
}

// drain reads st to its end.
func drain(t *testing.T, st engine.Stream) {
	t.Helper()
	defer st.Close()
	for {
		_, err := st.Recv()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
	}
}

// histogram returns a histogram's sample count and sum.
func histogram(t *testing.T, g prometheus.Gatherer, name string) (uint64, float64) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0, 0
}

// vllmCache is a vLLM scrape with a KV cache of blocks 16-token blocks and extra lines.
func vllmCache(blocks int, extra string) string {
	return fmt.Sprintf("vllm:num_requests_waiting 0\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"%d\"} 1\n%s", blocks, extra)
}

// TestResidencyFollowsServedPrompts runs requests through an engine in front of a server
// with an 8-block cache and checks, step by step, the prediction the server's report is judged
// against, what the model publishes, and its error metric.
func TestResidencyFollowsServedPrompts(t *testing.T) {
	a, b := chain(1, 3), chain(11, 5)
	steps := []struct {
		name    string
		blocks  []uint64
		cached  int // the server's cached_tokens; -1: not reported
		stored  []uint64
		evicted []uint64
		ratio   float64 // the error this request adds to the histogram's sum
		judged  bool    // it is observed in the histogram
	}{
		{name: "first prompt is stored, tail first", blocks: a, cached: 0, stored: []uint64{3, 2, 1}, judged: true},
		{name: "a second outgrows the cache: the first loses its tail", blocks: b, cached: 0,
			stored: []uint64{15, 14, 13, 12, 11}, evicted: []uint64{3}, judged: true},
		{name: "the first again: the 2 blocks left are predicted, block 3 comes back", blocks: a, cached: 32,
			stored: []uint64{3}, evicted: []uint64{15}, judged: true},
		{
			// The model predicts all of a, but the server reports nothing cached: it had lost
			// a, and so, evicting least recently used first, everything used before a's last
			// use too: b's blocks. a itself was just stored again.
			name: "the server had lost what the model predicted", blocks: a, cached: 0,
			evicted: []uint64{14, 13, 12, 11}, ratio: 48.0 / 50, judged: true,
		},
		{name: "no cached_tokens: nothing to judge", blocks: b, cached: -1, stored: []uint64{15, 14, 13, 12, 11}, evicted: []uint64{3}},
	}
	f := newFake(t)
	f.set(vllmCache(8, ""))
	reg := prometheus.NewRegistry()
	var log prefixLog
	e := newEngine(t, f, KindVLLM, func(c *Config) { c.OnPrefix, c.Registerer = log.on, reg })
	var judged uint64
	var sum float64
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			f.setGen(reply(len(s.blocks)*16+2, s.cached))
			st, err := e.Generate(context.Background(), request(s.blocks))
			if err != nil {
				t.Fatal(err)
			}
			drain(t, st)
			stored, evicted := log.take()
			if !slices.Equal(stored, s.stored) || !slices.Equal(evicted, s.evicted) {
				t.Errorf("published stored %v evicted %v, want %v, %v", stored, evicted, s.stored, s.evicted)
			}
			if s.judged {
				judged++
			}
			sum += s.ratio
			n, got := histogram(t, reg, "kvmesh_residency_error_ratio")
			if n != judged || fmt.Sprintf("%.6f", got) != fmt.Sprintf("%.6f", sum) {
				t.Errorf("error ratio histogram: %d samples, sum %v; want %d, %v", n, got, judged, sum)
			}
		})
	}
	if got, want := e.ResidentBlocks(), []uint64{2, 1, 15, 14, 13, 12, 11}; !slices.Equal(got, want) {
		t.Errorf("ResidentBlocks %v, want %v (least recent first)", got, want)
	}
	// Anchors are chain positions 0, 1 and 3: a's blocks 1 and 2, b's 11, 12 and 14.
	log.mu.Lock()
	published := log.anchors
	log.mu.Unlock()
	if got, want := e.ResidentAnchors(), []uint64{2, 1, 14, 12, 11}; !slices.Equal(got, want) || published != len(want) {
		t.Errorf("ResidentAnchors %v, published anchors net %d, want %v", got, published, want)
	}
	// Predicted cached tokens over the judged requests: 0, 0, 32, 48; reported 0, 0, 32, 0.
	if p, r := counter(t, reg, "kvmesh_residency_predicted_cached_tokens_total"),
		counter(t, reg, "kvmesh_residency_reported_cached_tokens_total"); p != 80 || r != 32 {
		t.Errorf("predicted %v and reported %v cached tokens, want 80 and 32", p, r)
	}
}

// TestQueuedPrefillIsWhatAwaitsItsFirstToken: a request's uncached prompt tokens count as
// queued prefill from dispatch to its first token, or to its failure, not longer.
func TestQueuedPrefillIsWhatAwaitsItsFirstToken(t *testing.T) {
	f := newFake(t)
	f.set(vllmCache(100, "vllm:num_requests_waiting 7\n"))
	e := newEngine(t, f, KindVLLM, nil)
	if q := e.State().QueuedPrefillTokens; q != 0 {
		t.Fatalf("queued prefill %d with nothing dispatched (waiting requests are not guessed at)", q)
	}
	release := make(chan struct{})
	hold := func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		reply(50, 0)(w, r)
	}
	run := func(blocks []uint64, want int) {
		t.Helper()
		f.setGen(hold)
		type result struct {
			st  engine.Stream
			err error
		}
		done := make(chan result, 1)
		go func() {
			st, err := e.Generate(context.Background(), request(blocks))
			done <- result{st, err}
		}()
		poll.Until(t, 5*time.Second, fmt.Sprintf("queued prefill of %d", want), func() bool {
			return e.State().QueuedPrefillTokens == want
		})
		release <- struct{}{}
		res := <-done
		if res.err != nil {
			t.Fatal(res.err)
		}
		if _, err := res.st.Recv(); err != nil {
			t.Fatal(err)
		}
		if q := e.State().QueuedPrefillTokens; q != 0 {
			t.Errorf("queued prefill %d after the first token", q)
		}
		drain(t, res.st)
	}
	run(chain(1, 3), 50)
	// Extends the first prompt by 2 blocks: its 3 cached blocks are not queued prefill.
	run(chain(1, 5), 82-48)

	f.setGen(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	if _, err := e.Generate(context.Background(), request(chain(100, 4))); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("err %v, want ErrUnavailable", err)
	}
	if q := e.State().QueuedPrefillTokens; q != 0 {
		t.Errorf("queued prefill %d after a refused request", q)
	}
}

// TestEngineRestartClearsResidency: whichever way a restart shows (the process start time, a
// counter going back, health failing and returning), the model is emptied and every block it
// held is published evicted; a lone failed scrape or an unchanged scrape clears nothing.
func TestEngineRestartClearsResidency(t *testing.T) {
	tests := []struct {
		name    string
		before  string
		restart func(f *fake, e *Engine)
		cleared bool
	}{
		{name: "process start time", before: "process_start_time_seconds 1700000000\n",
			restart: func(f *fake, e *Engine) {
				f.set(vllmCache(100, "process_start_time_seconds 1700000500\n"))
				e.scrape(context.Background())
			}, cleared: true},
		{name: "prompt counter went back", before: "vllm:prompt_tokens_total 5000\n",
			restart: func(f *fake, e *Engine) {
				f.set(vllmCache(100, "vllm:prompt_tokens_total 12\n"))
				e.scrape(context.Background())
			}, cleared: true},
		{name: "health failed and returned",
			restart: func(f *fake, e *Engine) {
				f.mu.Lock()
				f.status = http.StatusInternalServerError
				f.mu.Unlock()
				for range e.cfg.MaxScrapeFailures {
					e.scrape(context.Background())
				}
				if e.State().Healthy {
					t.Fatal("still healthy")
				}
				f.mu.Lock()
				f.status = 0
				f.mu.Unlock()
				e.scrape(context.Background())
			}, cleared: true},
		{name: "one failed scrape is no restart",
			restart: func(f *fake, e *Engine) {
				f.mu.Lock()
				f.status = http.StatusInternalServerError
				f.mu.Unlock()
				e.scrape(context.Background())
				f.mu.Lock()
				f.status = 0
				f.mu.Unlock()
				e.scrape(context.Background())
			}},
		{name: "same process, counters up", before: "process_start_time_seconds 1700000000\nvllm:prompt_tokens_total 5000\n",
			restart: func(f *fake, e *Engine) {
				f.set(vllmCache(100, "process_start_time_seconds 1700000000\nvllm:prompt_tokens_total 6000\n"))
				e.scrape(context.Background())
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			f.set(vllmCache(100, tt.before))
			reg := prometheus.NewRegistry()
			var log prefixLog
			e := newEngine(t, f, KindVLLM, func(c *Config) { c.OnPrefix, c.Registerer = log.on, reg })
			f.setGen(reply(50, 0))
			for _, blocks := range [][]uint64{chain(1, 3), chain(11, 3)} {
				st, err := e.Generate(context.Background(), request(blocks))
				if err != nil {
					t.Fatal(err)
				}
				drain(t, st)
			}
			log.take()
			tt.restart(f, e)
			_, evicted := log.take()
			slices.Sort(evicted)
			resets := counter(t, reg, "kvmesh_residency_resets_total")
			if tt.cleared {
				if len(e.ResidentBlocks()) != 0 || !slices.Equal(evicted, []uint64{1, 2, 3, 11, 12, 13}) || resets != 1 {
					t.Errorf("after a restart: resident %v, published evicted %v, resets %v", e.ResidentBlocks(), evicted, resets)
				}
				return
			}
			if len(e.ResidentBlocks()) != 6 || len(evicted) != 0 || resets != 0 {
				t.Errorf("no restart, yet: resident %v, published evicted %v, resets %v", e.ResidentBlocks(), evicted, resets)
			}
		})
	}
}

// TestOneRestartOneReset: a restart empties the model once. What the new instance then
// shows against the old one's figures (a prompt counter it exports only after its first
// request, below the old instance's; health returning after a restart already seen) is no
// second restart: the blocks served since stay resident.
func TestOneRestartOneReset(t *testing.T) {
	ctx := context.Background()
	metricsStatus := func(f *fake, status int) {
		f.mu.Lock()
		f.status = status
		f.mu.Unlock()
	}
	modelsStatus := func(f *fake, status int) {
		f.mu.Lock()
		f.modelsStatus = status
		f.mu.Unlock()
	}
	healthy := func(t *testing.T, e *Engine, want bool) {
		t.Helper()
		if got := e.State().Healthy; got != want {
			t.Fatalf("healthy %v, want %v", got, want)
		}
	}
	tests := []struct {
		name   string
		before string
		// restart takes the engine through its restart.
		restart func(t *testing.T, f *fake, e *Engine)
		// after follows the new blocks being served.
		after func(t *testing.T, f *fake, e *Engine)
	}{
		{name: "the prompt counter reappears below the old instance's after health returned",
			before: "vllm:prompt_tokens_total 5000\n",
			restart: func(t *testing.T, f *fake, e *Engine) {
				metricsStatus(f, http.StatusInternalServerError)
				for range e.cfg.MaxScrapeFailures {
					e.scrape(ctx)
				}
				healthy(t, e, false)
				f.set(vllmCache(100, "")) // the new instance, before its first request
				metricsStatus(f, 0)
				e.scrape(ctx)
				healthy(t, e, true)
			},
			after: func(t *testing.T, f *fake, e *Engine) {
				f.set(vllmCache(100, "vllm:prompt_tokens_total 50\n"))
				e.scrape(ctx)
			}},
		{name: "the start time changes while unhealthy, then health returns",
			before: "process_start_time_seconds 1700000000\n",
			restart: func(t *testing.T, f *fake, e *Engine) {
				modelsStatus(f, http.StatusInternalServerError)
				for range e.cfg.MaxScrapeFailures {
					_ = e.refreshModels(ctx, false)
				}
				healthy(t, e, false)
				f.set(vllmCache(100, "process_start_time_seconds 1700000500\n"))
				e.scrape(ctx)
				modelsStatus(f, 0)
				if err := e.refreshModels(ctx, false); err != nil {
					t.Fatal(err)
				}
				healthy(t, e, true)
			},
			after: func(t *testing.T, f *fake, e *Engine) { e.scrape(ctx) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			f.set(vllmCache(100, tt.before))
			reg := prometheus.NewRegistry()
			e := newEngine(t, f, KindVLLM, func(c *Config) { c.Registerer = reg })
			f.setGen(reply(50, 0))
			serve := func(blocks []uint64) {
				st, err := e.Generate(ctx, request(blocks))
				if err != nil {
					t.Fatal(err)
				}
				drain(t, st)
			}
			serve(chain(1, 3))
			tt.restart(t, f, e)
			serve(chain(21, 3))
			tt.after(t, f, e)
			resident := e.ResidentBlocks()
			slices.Sort(resident)
			if resets := counter(t, reg, "kvmesh_residency_resets_total"); resets != 1 || !slices.Equal(resident, chain(21, 3)) {
				t.Errorf("%v resets, resident %v; want 1, %v", resets, resident, chain(21, 3))
			}
		})
	}
}

// TestResidencyCapacityFollowsTheServer: the model holds what the server's scraped KV size
// holds, and a smaller size evicts.
func TestResidencyCapacityFollowsTheServer(t *testing.T) {
	f := newFake(t)
	f.set(vllmCache(100, ""))
	var log prefixLog
	e := newEngine(t, f, KindVLLM, func(c *Config) { c.OnPrefix = log.on })
	f.setGen(reply(0, -1))
	for _, blocks := range [][]uint64{chain(1, 3), chain(11, 3)} {
		st, err := e.Generate(context.Background(), request(blocks))
		if err != nil {
			t.Fatal(err)
		}
		drain(t, st)
	}
	log.take()
	// 64-token blocks × 1 = 4 of kvmesh's 16-token blocks.
	f.set("vllm:num_requests_waiting 0\nvllm:cache_config_info{block_size=\"64\",num_gpu_blocks=\"1\"} 1\n")
	e.scrape(context.Background())
	if _, evicted := log.take(); !slices.Equal(evicted, []uint64{3, 2}) {
		t.Errorf("shrinking to 4 blocks evicted %v, want [3 2]", evicted)
	}
	if got := e.ResidentBlocks(); !slices.Equal(got, []uint64{1, 13, 12, 11}) {
		t.Errorf("resident %v", got)
	}
}
