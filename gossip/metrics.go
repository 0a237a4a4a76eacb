package gossip

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	members  *prometheus.GaugeVec
	sent     prometheus.Counter
	received prometheus.Counter
	dropped  *prometheus.CounterVec
	// conflicts counts name conflicts by side (conflict.go).
	conflicts *prometheus.CounterVec
	stale     prometheus.Gauge
	policy    *prometheus.GaugeVec
	// The prefix index and the domains it covers.
	indexBytes  prometheus.Gauge
	indexBlocks prometheus.Gauge
	domainPeers prometheus.Gauge
	// joinFailing is 1 while the node is alone with seeds it cannot join (join.go).
	joinFailing prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, policy StalePolicy) (*metrics, error) {
	m := &metrics{
		members: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvmesh_gossip_members", Help: "Members in this node's view, by liveness.",
		}, []string{"liveness"}),
		sent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_gossip_sent_bytes_total", Help: "kvmesh broadcast bytes handed to memberlist.",
		}),
		received: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_gossip_received_bytes_total", Help: "kvmesh message and push/pull bytes received.",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_gossip_dropped_messages_total", Help: "Gossip messages dropped, by reason.",
		}, []string{"reason"}),
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_gossip_name_conflicts_total",
			Help: "Name conflicts seen: another process claiming this node's name (self) or a member's (member).",
		}, []string{"side"}),
		stale: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvmesh_gossip_stale_peers", Help: "Live peers whose last state record is older than StaleAfter.",
		}),
		policy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvmesh_gossip_stale_policy", Help: "1 for the stale-peer policy in force (closed or open).",
		}, []string{"policy"}),
		indexBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvmesh_gossip_index_bytes", Help: "Estimated heap of the prefix index: every peer's residency this node keeps.",
		}),
		indexBlocks: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvmesh_gossip_index_blocks", Help: "Confirmed (peer, block) entries in the prefix index.",
		}),
		joinFailing: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvmesh_gossip_join_failing",
			Help: "1 while this node is alone and its last join of its seeds reached no other member (a wrong gossip key, the seeds down): it serves alone.",
		}),
		domainPeers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvmesh_gossip_domain_peers", Help: "Alive peers sharing a model with this node: those its prefix summaries go to.",
		}),
	}
	for _, r := range dropReasons {
		m.dropped.WithLabelValues(r)
	}
	for _, side := range []string{conflictSelf, conflictMember} {
		m.conflicts.WithLabelValues(side)
	}
	for _, p := range []StalePolicy{FailClosed, FailOpen} {
		v := 0.0
		if p == policy {
			v = 1
		}
		m.policy.WithLabelValues(string(p)).Set(v)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.members, m.sent, m.received, m.dropped, m.conflicts, m.stale, m.policy, m.indexBytes, m.indexBlocks, m.domainPeers, m.joinFailing} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("gossip: register metrics: %w", errors.Join(ErrConfig, err))
		}
	}
	return m, nil
}
