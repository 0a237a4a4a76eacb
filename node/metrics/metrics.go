package metrics

import (
	"runtime"
	"runtime/debug"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/route"
)

// Metrics are the node's own families. Every request that reaches a handler is counted once in
// received and once in exactly one of completed, refused or failed, so the four reconcile.
type Metrics struct {
	Received  *prometheus.CounterVec // endpoint
	Completed *prometheus.CounterVec // endpoint
	Refused   *prometheus.CounterVec // code
	Failed    *prometheus.CounterVec // code
	InFlight  prometheus.Gauge
	TTFT      prometheus.Histogram
	TPOT      prometheus.Histogram
	E2E       prometheus.Histogram
	Forwards  *prometheus.CounterVec // result
	Ejections *prometheus.CounterVec // reason: transport.FailureReason's
	Retries   *prometheus.CounterVec // result: allowed or budget_exhausted
	Served    *prometheus.CounterVec // origin: local (ingested here) or forwarded (run for a peer)
	Migrated  *prometheus.CounterVec // outcome: migrationOutcomes; cause: migrationCauses
	Disagg    *prometheus.CounterVec // outcome: disaggOutcomes
	// AdapterRouted: outcome route.Residency's values
	AdapterRouted *prometheus.CounterVec

	Decisions      *prometheus.CounterVec // layer, decision, reason
	PoolDecisions  *prometheus.CounterVec // pool (admit.Pool*), decision
	ClassDecisions *prometheus.CounterVec // class, decision: a request's first verdict at its ingress
	Queued         prometheus.Counter
	Backfilled     prometheus.Counter
	QueueTime      prometheus.Histogram
	SLOFinished    *prometheus.CounterVec // class
	SLOMet         *prometheus.CounterVec // class
	BytesPerToken  *prometheus.GaugeVec   // model: at most kvindex.DefaultCalibrationMaxModels series
	CarbonRouted   prometheus.Counter
	CarbonDeferred prometheus.Counter
	Reloads        *prometheus.CounterVec // result: ok or error
	Reloaded       prometheus.Gauge
	FilesMissing   *prometheus.CounterVec // file: config or api_keys
	Delegated      *prometheus.CounterVec // outcome: delegateOutcomes
}

// Decision counts one admission verdict; label values are admit's bounded constants.
func (m *Metrics) Decision(layer string, a admit.Action, code string) {
	m.Decisions.WithLabelValues(layer, a.String(), code).Inc()
}

// DecisionOf counts d by layer and, past the checks of the request itself (validation and
// identity, before any pool is chosen), by the role pools it counted against.
func (m *Metrics) DecisionOf(d admit.Decision) {
	m.Decision(d.Layer, d.Action, d.Code)
	if d.Layer == admit.LayerValidation || d.Layer == admit.LayerIdentity {
		return
	}
	for _, p := range d.Pools() {
		m.PoolDecisions.WithLabelValues(p, d.Action.String()).Inc()
	}
}

// Bucket edges in seconds. latencyBuckets holds the default TTFT SLOs (1 s high, 2 s normal,
// 30 s low) and tpotBuckets the default TPOT ones (100 ms, 200 ms); New adds the
// configured class SLOs, so the share of requests within a class's target reads off a bucket.
var (
	latencyBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2, 2.5, 5, 10, 30, 60, 120}
	tpotBuckets    = []float64{.005, .01, .02, .03, .05, .075, .1, .15, .2, .3, .5, 1}
)

// Label values the request families are exported with from the start, at zero, so a rate over
// them is right from a node's first request and a dashboard shows 0, not "no data".
var (
	forwardResults    = []string{"local", "accepted", "refused", "unreachable", "owner_failed", "no_address"}
	origins           = []string{"local", "peer"}
	migrationOutcomes = []string{MigrationCompleted, MigrationFailed, MigrationRefused}
	migrationCauses   = []string{CauseOwner, CauseEngine}
	classes           = []string{admit.Class(admit.PriorityHigh), admit.Class(admit.PriorityNormal), admit.Class(admit.PriorityLow)}
)

// withEdges returns base with the positive targets added as edges, sorted and without
// duplicates.
func withEdges(base []float64, targets ...admit.Duration) []float64 {
	out := slices.Clone(base)
	for _, d := range targets {
		if d > 0 {
			out = append(out, time.Duration(d).Seconds())
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// revision is the VCS revision the binary was built from, or "unknown".
func revision() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				return s.Value
			}
		}
	}
	return "unknown"
}

// New builds the node's families and registers them on reg (nil: none); version is the
// kvmesh version kvmesh_build_info carries. slo gives the
// class SLOs (filled) that the TTFT and TPOT histograms get bucket edges at.
func New(reg prometheus.Registerer, slo admit.SLOConfig, version string) *Metrics {
	m := &Metrics{
		Received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_requests_received_total", Help: "API requests received by this node (generation, embeddings, responses), by endpoint.",
		}, []string{"endpoint"}),
		Completed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_requests_completed_total", Help: "Requests that ended in a full completion.",
		}, []string{"endpoint"}),
		Refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_requests_refused_total", Help: "Requests refused before the first byte, by error code.",
		}, []string{"code"}),
		Failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_requests_failed_total", Help: "Requests that failed after being accepted, by error code.",
		}, []string{"code"}),
		InFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvmesh_requests_in_flight", Help: "Requests this node's API is handling now.",
		}),
		TTFT: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kvmesh_request_ttft_seconds", Help: "Time from request arrival to the first output token, at the ingress.",
			Buckets: withEdges(latencyBuckets, slo.High.TTFT, slo.Normal.TTFT, slo.Low.TTFT),
		}),
		TPOT: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kvmesh_request_tpot_seconds", Help: "Mean time per output token after the first, of completed requests with two or more, at the node that ran them.",
			Buckets: withEdges(tpotBuckets, slo.High.TPOT, slo.Normal.TPOT, slo.Low.TPOT),
		}),
		E2E: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kvmesh_request_duration_seconds", Help: "Time from request arrival to the end of the response, at the ingress.", Buckets: latencyBuckets,
		}),
		Forwards: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_forward_attempts_total", Help: "Attempts to run a request on a peer, by result.",
		}, []string{"result"}),
		Ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_forward_peer_ejections_total", Help: "Peers taken out of routing because forwards to them failed at the transport, by reason (tls, timeout, refused, handshake).",
		}, []string{"reason"}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_forward_retries_total", Help: "Forwards after a failed attempt of the same request, by the retry budget's verdict: allowed, or budget_exhausted (the request ended with its failure).",
		}, []string{"result"}),
		Served: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_engine_requests_total", Help: "Requests run on this node's engine, by origin (local or peer).",
		}, []string{"origin"}),
		Migrated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_migrations_total", Help: "Requests whose owner or its engine failed mid-response, by what became of the move to another node: completed, failed (the continuation did not finish) or refused (not moved: the limit, or no node took it); and by cause: owner (the node failed) or engine (an engine under a live node: this node's, or one its owner reported).",
		}, []string{"outcome", "cause"}),
		Disagg: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_route_disaggregated_total", Help: "Disaggregated prefill and decode, in a mesh with prefill or decode nodes: requests dispatched split on a pair (split) or whole and why (whole_short, whole_link, whole_mixed, whole_no_pair; on a decode node whole_decode_short, whole_prefill_behind), and what became of split requests' halves (handover, prefill_retried, prefill_failed, decode_retried, handover_queued, decode_failed).",
		}, []string{"outcome"}),
		AdapterRouted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_route_adapter_requests_total", Help: "Requests for a LoRA adapter accepted for a node, once a request (at its first accept), by where the adapter stood there at that routing decision: resident (in a GPU slot), free_slot (loaded into a free slot) or swap (loaded in place of another adapter).",
		}, []string{"outcome"}),
	}
	m.Decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_admission_decisions_total", Help: "Admission verdicts, by layer, decision (accept, queue, refuse) and reason.",
	}, []string{"layer", "decision", "reason"})
	m.PoolDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_admission_pool_decisions_total", Help: "Admission verdicts by role pool (whole, prefill, decode: a split request's accept counts in both of its pools, a verdict on its decode room in decode) and decision (accept, queue, refuse).",
	}, []string{"pool", "decision"})
	for _, p := range []string{admit.PoolWhole, admit.PoolPrefill, admit.PoolDecode} {
		for _, a := range []admit.Action{admit.Accept, admit.Queue, admit.Refuse} {
			m.PoolDecisions.WithLabelValues(p, a.String())
		}
	}
	m.ClassDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_admission_class_decisions_total", Help: "First admission verdict on each request at its ingress (accept, queue, refuse), by priority class (high, normal, low).",
	}, []string{"class", "decision"})
	for _, c := range classes {
		for _, a := range []admit.Action{admit.Accept, admit.Queue, admit.Refuse} {
			m.ClassDecisions.WithLabelValues(c, a.String())
		}
	}
	m.Queued = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_admission_queued_total", Help: "Requests that waited in this node's waiting room.",
	})
	m.Backfilled = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_admission_backfilled_total", Help: "Queued requests dispatched past their pool's blocked head, on KV room it does not wait for.",
	})
	m.QueueTime = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "kvmesh_admission_queue_seconds", Help: "Time requests spent in the waiting room before dispatch or refusal.", Buckets: latencyBuckets,
	})
	m.SLOFinished = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_slo_requests_total", Help: "Completed requests this node ran (ingested here or forwarded by a peer), by priority class (high, normal, low).",
	}, []string{"class"})
	m.SLOMet = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_slo_met_total", Help: "Completed requests that met both their TTFT and TPOT SLOs (goodput), by priority class.",
	}, []string{"class"})
	m.BytesPerToken = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvmesh_tokens_bytes_per_token", Help: "Prompt bytes per token this node counts a model's prompts with, learned from its external engine's usage (4 until learned).",
	}, []string{"model"})
	m.CarbonRouted = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_carbon_rerouted_total", Help: "Sheddable requests kept off nodes whose grid is over the carbon threshold.",
	})
	m.CarbonDeferred = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_carbon_deferred_total", Help: "Sheddable requests refused with carbon_deferred.",
	})
	for _, r := range forwardResults {
		m.Forwards.WithLabelValues(r)
	}
	for _, o := range origins {
		m.Served.WithLabelValues(o)
	}
	for r := route.ResidencyResident; r < route.NumResidencies; r++ {
		m.AdapterRouted.WithLabelValues(r.String())
	}
	for _, o := range disaggOutcomes {
		m.Disagg.WithLabelValues(o)
	}
	for _, o := range migrationOutcomes {
		for _, c := range migrationCauses {
			m.Migrated.WithLabelValues(o, c)
		}
	}
	for _, r := range []string{RetryAllowed, RetryExhausted} {
		m.Retries.WithLabelValues(r)
	}
	for _, c := range classes {
		m.SLOFinished.WithLabelValues(c)
		m.SLOMet.WithLabelValues(c)
	}
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvmesh_build_info", Help: "Always 1; the kvmesh version, VCS revision and Go version this node was built with, in its labels.",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision(), "go_version": runtime.Version()},
	})
	buildInfo.Set(1)
	m.Reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_config_reloads_total", Help: "Reloads of the config file and the API key file (SIGHUP or a changed file), by result: ok, or error when a file was rejected and its previous settings stayed in force.",
	}, []string{"result"})
	for _, r := range []string{ReloadOK, ReloadError} {
		m.Reloads.WithLabelValues(r) // both series from the start, for rate() alerts
	}
	m.FilesMissing = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_config_files_missing_total", Help: "Times the config file or the API key file (file: config, api_keys) was found gone by the watch; its settings in force stay.",
	}, []string{"file"})
	for _, f := range []string{FileConfig, FileAPIKeys} {
		m.FilesMissing.WithLabelValues(f)
	}
	m.Reloaded = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvmesh_config_last_reload_success_timestamp_seconds", Help: "Unix time the settings in force were loaded: the node's start, or its last reload that succeeded.",
	})
	m.Delegated = newDelegated()
	if reg != nil {
		reg.MustRegister(m.Delegated)
		reg.MustRegister(m.Received, m.Completed, m.Refused, m.Failed, m.InFlight, m.TTFT, m.TPOT, m.E2E, m.Forwards, m.Ejections, m.Retries, m.Served, m.Migrated, m.Disagg, m.AdapterRouted,
			m.Decisions, m.PoolDecisions, m.ClassDecisions, m.Queued, m.Backfilled, m.QueueTime, m.SLOFinished, m.SLOMet, m.BytesPerToken, m.CarbonRouted, m.CarbonDeferred,
			m.Reloads, m.Reloaded, m.FilesMissing, buildInfo)
	}
	return m
}
