package sim

import (
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics exports the Sim under vLLM's metric names, so a scraper built for vLLM reads the
// embedded engine unchanged. Gauges and counters are read from the Sim at scrape time; one
// collector per Sim keeps two Sims on two registries independent.
type metrics struct {
	s                         *Sim
	running, waiting, kvUsage *prometheus.Desc
	queries, hits             *prometheus.Desc
	prompt, gen, preempt      *prometheus.Desc
	cacheInfo, loraInfo       *prometheus.Desc
	loraLoads                 *prometheus.Desc
	ttft, e2e, queue          prometheus.Histogram
}

// Buckets as vLLM uses them, so dashboards line up.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}
	e2eBuckets  = []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}
)

func newMetrics(s *Sim) *metrics {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &metrics{
		s:         s,
		running:   d("vllm:num_requests_running", "Requests in the running batch."),
		waiting:   d("vllm:num_requests_waiting", "Requests waiting to be scheduled."),
		kvUsage:   d("vllm:kv_cache_usage_perc", "Fraction of KV blocks held by running requests (0..1)."),
		queries:   d("vllm:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache."),
		hits:      d("vllm:prefix_cache_hits_total", "Prompt tokens found in the prefix cache."),
		prompt:    d("vllm:prompt_tokens_total", "Prompt tokens of scheduled requests."),
		gen:       d("vllm:generation_tokens_total", "Generated tokens."),
		preempt:   d("vllm:num_preemptions_total", "Sequences preempted (recompute)."),
		cacheInfo: d("vllm:cache_config_info", "KV cache configuration.", "block_size", "num_gpu_blocks"),
		loraInfo: d("vllm:lora_requests_info", "Running stats on LoRA requests: the adapters of running and waiting requests, comma-separated; the value is the time of the reading.",
			"max_lora", "running_lora_adapters", "waiting_lora_adapters"),
		loraLoads: d("kvmesh_sim_lora_loads_total", "LoRA adapters brought into a GPU slot (a free one, or in place of another adapter): what vLLM does not count, for comparing routing policies."),
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "vllm:time_to_first_token_seconds", Help: "Time to first token (wall clock).", Buckets: ttftBuckets,
		}),
		e2e: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "vllm:e2e_request_latency_seconds", Help: "Request latency, arrival to finish (wall clock).", Buckets: e2eBuckets,
		}),
		queue: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "vllm:request_queue_time_seconds", Help: "Time waiting before first scheduling (wall clock).", Buckets: e2eBuckets,
		}),
	}
}

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.running, m.waiting, m.kvUsage, m.queries, m.hits, m.prompt, m.gen, m.preempt, m.cacheInfo, m.loraInfo, m.loraLoads} {
		ch <- d
	}
	m.ttft.Describe(ch)
	m.e2e.Describe(ch)
	m.queue.Describe(ch)
}

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	s := m.s
	s.mu.Lock()
	running, waiting := float64(len(s.running)), float64(len(s.waiting))
	usage := float64(s.cache.used()) / float64(s.kvBlocks)
	q, h, p, g, pre := s.nQueries, s.nHits, s.nPrompt, s.nGen, s.nPreempt
	loads := s.lora.loads
	lora, loraOn := s.loraStateLocked(0), len(s.lora.known) > 0 || len(s.lora.slots) > 0
	s.mu.Unlock()
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	counter := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	gauge(m.running, running)
	gauge(m.waiting, waiting)
	gauge(m.kvUsage, usage)
	counter(m.queries, q)
	counter(m.hits, h)
	counter(m.prompt, p)
	counter(m.gen, g)
	counter(m.preempt, pre)
	counter(m.loraLoads, loads)
	gauge(m.cacheInfo, 1, strconv.Itoa(s.cfg.BlockTokens), strconv.Itoa(s.kvBlocks))
	if loraOn { // vLLM reports it when serving adapters (--enable-lora)
		gauge(m.loraInfo, float64(time.Now().UnixNano())/1e9, strconv.Itoa(lora.MaxLoRAs),
			strings.Join(lora.Running, ","), strings.Join(lora.Waiting, ","))
	}
	m.ttft.Collect(ch)
	m.e2e.Collect(ch)
	m.queue.Collect(ch)
}
