package node

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/admit/route"
)

// stateCollector exports, at scrape time, what the node's libraries count without metrics of
// their own (routing's filter drops and the waiting room's depth per priority band) and the
// hash of the config file in force.
type stateCollector struct {
	n           *Node
	filtered    *prometheus.Desc
	queueDepth  *prometheus.Desc
	queueTokens *prometheus.Desc
	configHash  *prometheus.Desc
}

func newStateCollector(n *Node) *stateCollector {
	return &stateCollector{
		n: n,
		filtered: prometheus.NewDesc("kvmesh_route_filtered_total",
			"Candidate peers dropped by routing's filters, by reason.", []string{"reason"}, nil),
		queueDepth: prometheus.NewDesc("kvmesh_admission_queue_requests",
			"Requests waiting in this node's waiting room, by priority.", []string{"priority"}, nil),
		queueTokens: prometheus.NewDesc("kvmesh_admission_queue_prefill_tokens",
			"Prefill tokens waiting in this node's waiting room, by priority.", []string{"priority"}, nil),
		configHash: prometheus.NewDesc("kvmesh_config_hash_info",
			"Always 1; hash is the SHA-256 of the config file in force as sha256sum prints it (\"none\" without a config file).", []string{"hash"}, nil),
	}
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.filtered
	ch <- c.queueDepth
	ch <- c.queueTokens
	ch <- c.configHash
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	for reason, v := range c.n.planner.Policy().Counts() {
		ch <- prometheus.MustNewConstMetric(c.filtered, prometheus.CounterValue, float64(v), route.Reason(reason).String())
	}
	room := c.n.adm.Room()
	for prio, v := range room.QueuedRequests() {
		ch <- prometheus.MustNewConstMetric(c.queueDepth, prometheus.GaugeValue, float64(v), strconv.Itoa(prio))
	}
	for prio, v := range room.QueuedTokens() {
		ch <- prometheus.MustNewConstMetric(c.queueTokens, prometheus.GaugeValue, float64(v), strconv.Itoa(prio))
	}
	ch <- prometheus.MustNewConstMetric(c.configHash, prometheus.GaugeValue, 1, c.n.configHash())
}
