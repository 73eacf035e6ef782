package gateway

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the gateway's Prometheus series (namespace kvasir_gateway):
//
//	kvasir_gateway_sessions_open                  splices open now
//	kvasir_gateway_sessions_total                 worker upgrades spliced to the hub
//	kvasir_gateway_bytes_bridged_total{dir}       bytes copied, dir = up (worker -> hub) | down
//	kvasir_gateway_splice_errors_total{reason}    splices that ended on an error: idle_timeout, read, write
//	kvasir_gateway_refused_upgrades_total{reason} refused upgrades: not_upgrade, unsigned, wrong_host, bad_signature,
//	                                              old_signature (a worker older than signature v2),
//	                                              stale, replayed, hub_unreachable, hub_error, hub_forbidden (the hub
//	                                              refused the gateway's signature: secret or clock), hub_refused, hijack,
//	                                              and connections closed before or during their TLS handshake:
//	                                              handshake_total, handshake_per_address, handshake_timeout
//
// The crediting service adds kvasir_gateway_credit_* (credit.Service.Collector)
// when the gateway command runs it.
type metrics struct {
	sessions     prometheus.Counter
	up, down     prometheus.Counter
	spliceErrors *prometheus.CounterVec
	refused      *prometheus.CounterVec
}

func newMetrics(g *Gateway, reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "kvasir", "gateway"
	bridged := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "bytes_bridged_total",
		Help: "Bytes spliced after the upgrade, by direction (up: worker -> hub, down: hub -> worker)."}, []string{"dir"})
	m := &metrics{
		sessions: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "sessions_total",
			Help: "Worker upgrades spliced to the hub."}),
		up:   bridged.WithLabelValues("up"),
		down: bridged.WithLabelValues("down"),
		spliceErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "splice_errors_total",
			Help: "Splices that ended on an error, by reason (idle_timeout, read, write)."}, []string{"reason"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "refused_upgrades_total",
			Help: "Worker upgrades refused, by reason."}, []string{"reason"}),
	}
	open := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "sessions_open",
		Help: "Splices open now."}, func() float64 { return float64(g.active.Load()) })
	for _, c := range []prometheus.Collector{m.sessions, bridged, m.spliceErrors, m.refused, open} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// MetricsHandler serves the gateway's registry (Config.Registry, or the
// one it made) in the Prometheus text format. The gateway command serves
// it on --metrics-listen, never on the public TLS listener.
func (g *Gateway) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(g.gatherer, promhttp.HandlerOpts{})
}

// spliceErrorReason classifies a read error that ended a splice direction
// ("" for a normal end: EOF, or the connection closed by the gateway).
func spliceErrorReason(err error) string {
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed):
		return ""
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "idle_timeout"
	}
	return "read"
}
