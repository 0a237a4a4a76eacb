package transport

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Label values, fixed so label sets stay bounded.
const (
	dirIn  = "in"
	dirOut = "out"

	resultAccepted    = "accepted"
	resultRefused     = "refused"
	resultUnreachable = "unreachable"
	resultCancelled   = "cancelled"
	resultError       = "error"

	reasonNotQUIC   = "not_quic"
	reasonHandshake = "handshake"
	reasonHeader    = "bad_header"
	reasonVersion   = "version"
	reasonKind      = "unknown_kind"
	reasonBody      = "bad_body"
	reasonNoHandler = "no_handler"
)

type metrics struct {
	streams    *prometheus.CounterVec
	conns      *prometheus.GaugeVec
	dialErrors prometheus.Counter
	redials    prometheus.Counter
	rejected   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		streams: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_transport_streams_total",
			Help: "Forward streams by direction (in, out) and how they were answered.",
		}, []string{"direction", "result"}),
		conns: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvmesh_transport_connections",
			Help: "Open peer QUIC connections by direction (in: accepted, out: dialed).",
		}, []string{"direction"}),
		dialErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_transport_dial_errors_total",
			Help: "Failed dials to peers (unreachable, handshake refused or timed out).",
		}),
		redials: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_transport_redials_total",
			Help: "Forwards sent once more on a new connection because theirs proved dead before the owner answered (a peer that restarted or forgot it, this host resumed after a freeze).",
		}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_transport_rejected_total",
			Help: "Inbound packets, connections and streams dropped, by reason.",
		}, []string{"reason"}),
	}
	for _, d := range []string{dirIn, dirOut} {
		m.conns.WithLabelValues(d) // at zero until a connection opens
	}
	if reg == nil {
		return m, nil
	}
	var err error
	m.streams = register(reg, m.streams, &err)
	m.conns = register(reg, m.conns, &err)
	m.dialErrors = register(reg, m.dialErrors, &err)
	m.redials = register(reg, m.redials, &err)
	m.rejected = register(reg, m.rejected, &err)
	return m, err
}

// register registers c, or returns the collector already registered under its name, so two
// transports on one registry (tests, a process hosting several nodes) share the series.
func register[C prometheus.Collector](reg prometheus.Registerer, c C, errp *error) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if prev, ok := are.ExistingCollector.(C); ok {
				return prev
			}
		}
		if *errp == nil {
			*errp = err
		}
	}
	return c
}
