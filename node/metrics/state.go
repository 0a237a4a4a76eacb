package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/node/engine"
)

// StateSources are what a StateCollector reads at each scrape. Each must stay valid for the
// collector's life: the node builds them once, before it registers the collector.
type StateSources struct {
	Policy     route.Policy       // routing's filter drops (Counts)
	Room       *admit.WaitingRoom // the waiting room's depth and token caps
	Engine     interface{ State() engine.State }
	ConfigHash func() string // the hash of the config file in force
}

// StateCollector exports, at scrape time, what the node's libraries count without metrics of
// their own: routing's filter drops, the waiting room's depth per priority band, the engine's
// token cap per pool, the engine's load as the node sees it (State), the same for the embedded
// and an external engine, and the hash of the config file in force.
type StateCollector struct {
	src         StateSources
	filtered    *prometheus.Desc
	queueDepth  *prometheus.Desc
	queueTokens *prometheus.Desc
	queueCap    *prometheus.Desc
	running     *prometheus.Desc
	waiting     *prometheus.Desc
	kvUse       *prometheus.Desc
	hitRatio    *prometheus.Desc
	configHash  *prometheus.Desc
}

// namedBands are the priority bands the queue gauges show at zero when nothing waits in them:
// those of X-Kvmesh-Priority's names. A band of another value shows while it holds requests.
var namedBands = []int{admit.PriorityHigh, admit.PriorityNormal, admit.PriorityLow}

// NewStateCollector returns the collector of src.
func NewStateCollector(src StateSources) *StateCollector {
	return &StateCollector{
		src: src,
		filtered: prometheus.NewDesc("kvmesh_route_filtered_total",
			"Candidate peers dropped by routing's filters, by reason.", []string{"reason"}, nil),
		queueDepth: prometheus.NewDesc("kvmesh_admission_queue_requests",
			"Requests waiting in this node's waiting room, by priority.", []string{"priority"}, nil),
		queueTokens: prometheus.NewDesc("kvmesh_admission_queue_prefill_tokens",
			"Prefill tokens waiting in this node's waiting room, by priority.", []string{"priority"}, nil),
		queueCap: prometheus.NewDesc("kvmesh_admission_queue_token_cap",
			"Prefill tokens this node's waiting room lets a pool hold before it refuses: queue.max_tokens when set, else the pool's target TTFT times the prefill rate of the nodes that serve it (queue.fallback_tokens while none does), by model and pool (whole, prefill).",
			[]string{"model", "pool"}, nil),
		running: prometheus.NewDesc("kvmesh_engine_requests_running",
			"Requests in this node's engine's running batch.", nil, nil),
		waiting: prometheus.NewDesc("kvmesh_engine_requests_waiting",
			"Requests waiting inside this node's engine to be scheduled.", nil, nil),
		kvUse: prometheus.NewDesc("kvmesh_engine_kv_use_ratio",
			"Share of this node's engine's KV blocks in use, 0..1.", nil, nil),
		hitRatio: prometheus.NewDesc("kvmesh_engine_prefix_hit_ratio",
			"Share of this node's engine's recent prompt tokens found in its prefix cache, 0..1.", nil, nil),
		configHash: prometheus.NewDesc("kvmesh_config_hash_info",
			"Always 1; hash is the SHA-256 of the config file in force as sha256sum prints it (\"none\" without a config file).", []string{"hash"}, nil),
	}
}

func (c *StateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.filtered, c.queueDepth, c.queueTokens, c.queueCap, c.running, c.waiting, c.kvUse, c.hitRatio, c.configHash} {
		ch <- d
	}
}

func (c *StateCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for reason, v := range c.src.Policy.Counts() {
		ch <- prometheus.MustNewConstMetric(c.filtered, prometheus.CounterValue, float64(v), route.Reason(reason).String())
	}
	room := c.src.Room
	for _, by := range []struct {
		d *prometheus.Desc
		m map[int]int
	}{{c.queueDepth, room.QueuedRequests()}, {c.queueTokens, room.QueuedTokens()}} {
		for _, prio := range namedBands {
			if _, ok := by.m[prio]; !ok {
				by.m[prio] = 0
			}
		}
		for prio, v := range by.m {
			gauge(by.d, float64(v), strconv.Itoa(prio))
		}
	}
	for _, pc := range room.PoolCaps() {
		gauge(c.queueCap, float64(pc.Tokens), pc.Model, pc.Pool)
	}
	st := c.src.Engine.State()
	kvUse := 0.0
	if st.KVBlocksTotal > 0 {
		kvUse = float64(st.KVBlocksUsed) / float64(st.KVBlocksTotal)
	}
	gauge(c.running, float64(st.Running))
	gauge(c.waiting, float64(st.Waiting))
	gauge(c.kvUse, kvUse)
	gauge(c.hitRatio, st.HitRate)
	ch <- prometheus.MustNewConstMetric(c.configHash, prometheus.GaugeValue, 1, c.src.ConfigHash())
}
