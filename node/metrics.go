package node

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/admit"
)

// metrics are the node's own families. Every request that reaches a handler is counted once in
// received and once in exactly one of completed, refused or failed, so the four reconcile.
type metrics struct {
	received  *prometheus.CounterVec // endpoint
	completed *prometheus.CounterVec // endpoint
	refused   *prometheus.CounterVec // code
	failed    *prometheus.CounterVec // code
	inFlight  prometheus.Gauge
	ttft      prometheus.Histogram
	e2e       prometheus.Histogram
	forwards  *prometheus.CounterVec // result
	served    *prometheus.CounterVec // origin: local (ingested here) or forwarded (run for a peer)

	decisions      *prometheus.CounterVec // layer, decision, reason
	queued         prometheus.Counter
	backfilled     prometheus.Counter
	queueTime      prometheus.Histogram
	sloFinished    *prometheus.CounterVec // class
	sloMet         *prometheus.CounterVec // class
	bytesPerToken  *prometheus.GaugeVec   // model: at most kvindex.DefaultCalibrationMaxModels series
	carbonRouted   prometheus.Counter
	carbonDeferred prometheus.Counter
	reloads        *prometheus.CounterVec // result: ok or error
	reloaded       prometheus.Gauge
	// Registered only when the carbon signal is configured.
	carbonMode      *prometheus.GaugeVec
	carbonIntensity prometheus.Gauge
}

// decision counts one admission verdict; label values are admit's bounded constants.
func (m *metrics) decision(layer string, a admit.Action, code string) {
	m.decisions.WithLabelValues(layer, a.String(), code).Inc()
}

func (m *metrics) decisionOf(d admit.Decision) { m.decision(d.Layer, d.Action, d.Code) }

var latencyBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_requests_received_total", Help: "API requests received by this node (generation, embeddings, responses), by endpoint.",
		}, []string{"endpoint"}),
		completed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_requests_completed_total", Help: "Requests that ended in a full completion.",
		}, []string{"endpoint"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_requests_refused_total", Help: "Requests refused before the first byte, by error code.",
		}, []string{"code"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_requests_failed_total", Help: "Requests that failed after being accepted, by error code.",
		}, []string{"code"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvmesh_requests_in_flight", Help: "Requests this node's API is handling now.",
		}),
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kvmesh_request_ttft_seconds", Help: "Time from request arrival to the first output token, at the ingress.", Buckets: latencyBuckets,
		}),
		e2e: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kvmesh_request_duration_seconds", Help: "Time from request arrival to the end of the response, at the ingress.", Buckets: latencyBuckets,
		}),
		forwards: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_forward_attempts_total", Help: "Attempts to run a request on a peer, by result.",
		}, []string{"result"}),
		served: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_engine_requests_total", Help: "Requests run on this node's engine, by origin (local or peer).",
		}, []string{"origin"}),
	}
	m.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_admission_decisions_total", Help: "Admission verdicts, by layer, decision (accept, queue, refuse) and reason.",
	}, []string{"layer", "decision", "reason"})
	m.queued = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_admission_queued_total", Help: "Requests that waited in this node's waiting room.",
	})
	m.backfilled = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_admission_backfilled_total", Help: "Queued requests dispatched past their pool's blocked head, on KV room it does not wait for.",
	})
	m.queueTime = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "kvmesh_admission_queue_seconds", Help: "Time requests spent in the waiting room before dispatch or refusal.", Buckets: latencyBuckets,
	})
	m.sloFinished = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_slo_requests_total", Help: "Completed requests ingested here, by priority class (high, normal, low).",
	}, []string{"class"})
	m.sloMet = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_slo_met_total", Help: "Completed requests that met both their TTFT and TPOT SLOs (goodput), by priority class.",
	}, []string{"class"})
	m.bytesPerToken = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvmesh_tokens_bytes_per_token", Help: "Prompt bytes per token this node counts a model's prompts with, learned from its external engine's usage (4 until learned).",
	}, []string{"model"})
	m.carbonRouted = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_carbon_rerouted_total", Help: "Sheddable requests kept off nodes whose grid is over the carbon threshold.",
	})
	m.carbonDeferred = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_carbon_deferred_total", Help: "Sheddable requests refused with carbon_deferred.",
	})
	m.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_config_reloads_total", Help: "Reloads of the config file and the API key file (SIGHUP or a changed file), by result: ok, or error when a file was rejected and its previous settings stayed in force.",
	}, []string{"result"})
	for _, r := range []string{reloadOK, reloadError} {
		m.reloads.WithLabelValues(r) // both series from the start, for rate() alerts
	}
	m.reloaded = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvmesh_config_last_reload_success_timestamp_seconds", Help: "Unix time the settings in force were loaded: the node's start, or its last reload that succeeded.",
	})
	if reg != nil {
		reg.MustRegister(m.received, m.completed, m.refused, m.failed, m.inFlight, m.ttft, m.e2e, m.forwards, m.served,
			m.decisions, m.queued, m.backfilled, m.queueTime, m.sloFinished, m.sloMet, m.bytesPerToken, m.carbonRouted, m.carbonDeferred,
			m.reloads, m.reloaded)
	}
	return m
}
