package external

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// sample is one series of the text exposition format.
type sample struct {
	labels map[string]string
	value  float64
}

// parseMetrics reads the Prometheus text exposition format into samples by metric name, less
// per-priority breakdowns (dropBreakdowns). It is lenient: lines it cannot parse are skipped,
// since one odd family must not blind the scrape.
func parseMetrics(r io.Reader) (map[string][]sample, error) {
	out := map[string][]sample{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, labels, rest, ok := splitSeries(line)
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		out[name] = append(out[name], sample{labels: labels, value: v})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("external: reading metrics: %w", err)
	}
	dropBreakdowns(out)
	return out, nil
}

// breakdownLabel splits a family by request priority. SGLang with priority scheduling exports
// each request gauge's total under priority="" and a series per priority beside it, which a
// sum would count twice.
const breakdownLabel = "priority"

// dropBreakdowns keeps only the total of each family that has one; a family split by
// priority without a total keeps its parts, which add up to it.
func dropBreakdowns(m map[string][]sample) {
	for name, ss := range m {
		if slices.ContainsFunc(ss, isTotal) {
			m[name] = slices.DeleteFunc(ss, func(s sample) bool { return s.labels[breakdownLabel] != "" })
		}
	}
}

func isTotal(s sample) bool {
	v, ok := s.labels[breakdownLabel]
	return ok && v == ""
}

// splitSeries splits `name{a="b",c="d"} rest` into its parts.
func splitSeries(line string) (name string, labels map[string]string, rest string, ok bool) {
	i := strings.IndexAny(line, "{ \t")
	if i <= 0 {
		return "", nil, "", false
	}
	name = line[:i]
	if line[i] != '{' {
		return name, nil, line[i:], true
	}
	labels = map[string]string{}
	s := line[i+1:]
	for {
		s = strings.TrimLeft(s, " ,")
		if s == "" {
			return "", nil, "", false
		}
		if s[0] == '}' {
			return name, labels, s[1:], true
		}
		eq := strings.IndexByte(s, '=')
		if eq <= 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return "", nil, "", false
		}
		key := strings.TrimSpace(s[:eq])
		s = s[eq+2:]
		var val strings.Builder
		j := 0
		for ; j < len(s) && s[j] != '"'; j++ {
			if s[j] == '\\' && j+1 < len(s) {
				j++
				switch s[j] {
				case 'n':
					val.WriteByte('\n')
				default:
					val.WriteByte(s[j])
				}
				continue
			}
			val.WriteByte(s[j])
		}
		if j >= len(s) {
			return "", nil, "", false
		}
		labels[key] = val.String()
		s = s[j+1:]
	}
}

// sum adds a family's series (one per model or engine replica) and says whether it exists.
func sum(m map[string][]sample, names ...string) (float64, bool) {
	for _, n := range names {
		if ss, ok := m[n]; ok {
			t := 0.0
			for _, s := range ss {
				t += s.value
			}
			return t, true
		}
	}
	return 0, false
}

// mean averages a 0..1 gauge over its series.
func mean(m map[string][]sample, names ...string) (float64, bool) {
	for _, n := range names {
		if ss, ok := m[n]; ok && len(ss) > 0 {
			t, _ := sum(m, n)
			return t / float64(len(ss)), true
		}
	}
	return 0, false
}

// kvTokens is the server's KV size in its tokens: from its cache_config_info series (one per
// data-parallel engine), else the kind's total-tokens gauge, else 0 and false.
func kvTokens(m map[string][]sample, names kindNames) (int, bool) {
	total := 0
	for _, s := range m[names.cacheInfo] {
		total += seriesTokens(s.labels, names)
	}
	if total > 0 {
		return total, true
	}
	if v, ok := sum(m, names.kvTotalTokens); ok && v >= 1 {
		return int(v), true
	}
	return 0, false
}

// seriesTokens is one cache_config_info series' KV size: its tokens label where it has one
// (right for hybrid models, whose block size × blocks is not), else size × count, else 0.
func seriesTokens(labels map[string]string, names kindNames) int {
	if v, err := strconv.Atoi(labels[names.tokensLabel]); err == nil && v > 0 {
		return v
	}
	size, err1 := strconv.Atoi(labels[names.sizeLabel])
	count, err2 := strconv.Atoi(labels[names.countLabel])
	if err1 != nil || err2 != nil || size <= 0 || count <= 0 {
		return 0 // vLLM 0.8 sends num_gpu_blocks="None"
	}
	return size * count
}

// kindNames are the metric names of one engine kind. An empty name is a figure the kind does
// not export: the node then uses its own (see apply and doc.go).
type kindNames struct {
	waiting, running, kvUse []string
	cacheInfo               string // a gauge of value 1 whose labels give the KV size
	sizeLabel, countLabel   string // of cacheInfo: tokens a block, blocks
	tokensLabel             string // of cacheInfo: the KV size in tokens, preferred
	kvTotalTokens           string // the KV size in tokens, when cacheInfo is absent
	blockGauge              string // the KV block size in tokens, when cacheInfo is absent
	// hits and queries are prefix cache counters: the hit rate between two scrapes. hitRate
	// is a hit rate gauge, for a kind without them.
	hits, queries []string
	hitRate       string
	// prompt counts the prompt tokens the server took in (a restart sets it back); cached
	// counts those of them its prefix cache served.
	prompt, cached string
	// loraInfo is the LoRA adapter info gauge (lora.go).
	loraInfo string
}

// kinds maps each engine kind to its names. Sources, and the recorded expositions the tests
// read, are in testdata/*.metrics.
var kinds = map[string]kindNames{
	// vLLM V1. Each family has a series per data-parallel engine ("engine" label). The gpu_
	// names are 0.8's (deprecated in 0.9, then hidden); 0.8 counts its prefix cache in blocks,
	// so those counters give the hit rate but are not subtracted from prompt tokens.
	// cache_config_info carries every CacheConfig field; kv_cache_size_tokens only in newer
	// releases, and 0.8 sends num_gpu_blocks="None".
	KindVLLM: {waiting: []string{"vllm:num_requests_waiting"}, running: []string{"vllm:num_requests_running"},
		kvUse:     []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"},
		cacheInfo: "vllm:cache_config_info", sizeLabel: "block_size", countLabel: "num_gpu_blocks",
		tokensLabel: "kv_cache_size_tokens",
		hits:        []string{"vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"},
		queries:     []string{"vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"},
		prompt:      "vllm:prompt_tokens_total", cached: "vllm:prefix_cache_hits_total",
		loraInfo: "vllm:lora_requests_info"},
	// SGLang with --enable-metrics. cache_config_info (page_size, num_pages) is in older
	// releases; newer ones export page_size as a gauge; max_total_num_tokens is in both. It has
	// no prefix cache counters, only a hit rate gauge.
	KindSGLang: {waiting: []string{"sglang:num_queue_reqs"}, running: []string{"sglang:num_running_reqs"},
		kvUse:     []string{"sglang:token_usage"},
		cacheInfo: "sglang:cache_config_info", sizeLabel: "page_size", countLabel: "num_pages",
		kvTotalTokens: "sglang:max_total_num_tokens", blockGauge: "sglang:page_size",
		hitRate: "sglang:cache_hit_rate",
		prompt:  "sglang:prompt_tokens_total", cached: "sglang:cached_tokens_total"},
	// llama.cpp's server with --metrics. No KV size, block size or prefix cache figures;
	// recent builds dropped the KV usage gauge too. Its prompt counter counts only the tokens
	// it evaluated, after reusing a slot's cache, so nothing is subtracted.
	KindLlamaCpp: {waiting: []string{"llamacpp:requests_deferred"}, running: []string{"llamacpp:requests_processing"},
		kvUse: []string{"llamacpp:kv_cache_usage_ratio"}, prompt: "llamacpp:prompt_tokens_total"},
	// TGI: request gauges only. Its input-length histogram is recorded when a request is
	// validated, before it queues, so it does not measure prefill.
	KindTGI: {waiting: []string{"tgi_queue_size"}, running: []string{"tgi_batch_current_size"}},
}

var errNoMetrics = errors.New("external: engine exports none of the expected metrics")

// scrape fetches /metrics once and updates the state; failures count toward unhealthy, which
// also zeroes the running and waiting requests and the KV blocks in use.
func (e *Engine) scrape(ctx context.Context) {
	m, err := e.fetchMetrics(ctx)
	if err == nil {
		err = e.apply(time.Now(), m)
	}
	if err != nil {
		e.scrapeErrors.Inc()
		e.mu.Lock()
		e.fails++
		if e.fails >= e.cfg.MaxScrapeFailures {
			if e.state.Healthy {
				e.log.Warn("engine unhealthy", "url", e.base.String(), "failures", e.fails, "err", err)
			}
			// The last scrape's load no longer holds: an engine that does not answer runs
			// none of this node's requests, and peers and kvmesh status must not show it busy.
			e.state.Healthy = false
			e.state.Running, e.state.Waiting, e.state.KVBlocksUsed = 0, 0, 0
			e.state.LoRA.Running, e.state.LoRA.Waiting, e.state.LoRA.Resident = nil, nil, nil
		}
		e.mu.Unlock()
		e.log.Debug("engine scrape failed", "url", e.base.String(), "err", err)
	}
	e.res.scraped(m, e.State()) // residency.go: KV size and restarts
}

func (e *Engine) fetchMetrics(ctx context.Context) (map[string][]sample, error) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.ScrapeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.url("/metrics"), nil)
	if err != nil {
		return nil, fmt.Errorf("external: metrics request: %w", err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := e.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("external: scraping metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("external: scraping metrics: status %d", resp.StatusCode)
	}
	return parseMetrics(io.LimitReader(resp.Body, 16<<20))
}

// apply maps one scrape into the state.
func (e *Engine) apply(now time.Time, m map[string][]sample) error {
	names := kinds[e.cfg.Kind]
	waiting, okW := sum(m, names.waiting...)
	running, okR := sum(m, names.running...)
	if !okW && !okR {
		return errNoMetrics
	}
	use, _ := mean(m, names.kvUse...)
	use = math.Min(math.Max(use, 0), 1)

	e.mu.Lock()
	defer e.mu.Unlock()
	s := &e.state
	s.Waiting, s.Running = int(waiting), int(running)
	s.BlockTokens = e.cfg.BlockTokens
	s.KVBlocksTotal = e.cfg.NominalKVBlocks
	if tokens, ok := kvTokens(m, names); ok {
		s.KVBlocksTotal = max(1, tokens/e.cfg.BlockTokens)
	}
	s.KVBlocksUsed = int(math.Round(use * float64(s.KVBlocksTotal)))
	e.hitRateLocked(m, names)
	e.measurePrefillLocked(now, m, s.Waiting)
	s.LoRA = loraState(m, names.loraInfo)
	s.Healthy = true
	e.fails = 0
	return nil
}

// hitRateLocked sets the hit rate from the kind's prefix cache counters over the interval
// since the last scrape, or from its hit rate gauge.
func (e *Engine) hitRateLocked(m map[string][]sample, names kindNames) {
	hits, okH := sum(m, names.hits...)
	queries, okQ := sum(m, names.queries...)
	if okH && okQ {
		// Counters reset when the engine restarts: skip that interval rather than go negative.
		if e.haveLast && queries > e.lastQ && hits >= e.lastHits {
			e.state.HitRate = math.Min(1, (hits-e.lastHits)/(queries-e.lastQ))
		}
		e.lastHits, e.lastQ, e.haveLast = hits, queries, true
	} else if r, ok := mean(m, names.hitRate); ok {
		e.state.HitRate = math.Min(math.Max(r, 0), 1)
	}
}

// prefillWeight is the weight of a new sample in the moving prefill rate.
const prefillWeight = 0.3

// measurePrefillLocked learns the server's prefill throughput from its counters: the prompt
// tokens it took in, less those its prefix cache served (kindNames.prompt and cached), per
// second over a scrape interval in which requests waited at both ends, so that what it did was
// all it could. An idle or lightly loaded server teaches nothing and keeps the last figure. State
// reports the figure unless Config.PrefillTokensPerSecond sets one: admission prices queued
// work, fits default TTFT targets and caps the waiting room by it.
func (e *Engine) measurePrefillLocked(now time.Time, m map[string][]sample, waiting int) {
	names := kinds[e.cfg.Kind]
	prompt, okP := sum(m, names.prompt)
	if !okP {
		return
	}
	hits, _ := sum(m, names.cached)
	if !e.prefillAt.IsZero() && now.After(e.prefillAt) && prompt >= e.lastPrompt && hits >= e.lastPromptHits &&
		waiting > 0 && e.lastWaiting > 0 {
		rate := ((prompt - e.lastPrompt) - (hits - e.lastPromptHits)) / now.Sub(e.prefillAt).Seconds()
		switch {
		case rate <= 0:
		case e.prefillRate == 0:
			e.prefillRate = rate
		default:
			e.prefillRate += prefillWeight * (rate - e.prefillRate)
		}
	}
	e.lastPrompt, e.lastPromptHits, e.prefillAt, e.lastWaiting = prompt, hits, now, waiting
	if e.cfg.PrefillTokensPerSecond <= 0 && e.prefillRate > 0 {
		e.state.PrefillTokensPerSecond = e.prefillRate
	}
}
