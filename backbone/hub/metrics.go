package hub

import (
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// MetricsPath is where the hub serves its Prometheus metrics (on its LAN
// listener).
const MetricsPath = "/metrics"

// metrics are the hub's Prometheus series (namespace kvasir_hub):
//
//	kvasir_hub_sessions_open                      sessions being bridged
//	kvasir_hub_sessions_total                     sessions started
//	kvasir_hub_bytes_bridged_total{dir}           WebSocket message bytes, dir = to_worker | from_worker
//	kvasir_hub_bridge_errors_total{reason}        sessions that ended on an error (backbone_unreachable,
//	                                              backbone_link, backbone_write, worker_read, worker_write, bad_message)
//	kvasir_hub_refused_upgrades_total{reason}     /v1/worker requests refused (unsigned, bad_mac, stale,
//	                                              replayed, bad_worker_id, no_secret)
//	kvasir_hub_ledger_bytes_total{kind}           bytes appended to the ledger, kind = creditable | rejected
//	kvasir_hub_forfeited_bytes_total              creditable bytes forfeited (LinkForfeit)
//	kvasir_hub_unsettled_bytes                    creditable bytes held back until settled
//	kvasir_hub_ledger_transactions_total          ledger appends (one per flush, all sessions together)
//	kvasir_hub_ledger_rows_total                  ledger rows appended
//	kvasir_hub_ledger_errors_total                failed appends (the rows are sent again, unchanged)
//	kvasir_hub_ledger_unacked_rows                rows waiting to be sent again after a failed append
//	kvasir_hub_ledger_lag_seconds                 age of the oldest of those rows (0: none waits)
//	kvasir_hub_ledger_append_seconds              histogram: one append transaction
//	kvasir_hub_ledger_batch_rows                  histogram: rows per append transaction
type metrics struct {
	sessions      prometheus.Counter
	bridged       *prometheus.CounterVec
	bridgeErrors  *prometheus.CounterVec
	refused       *prometheus.CounterVec
	ledgerBytes   *prometheus.CounterVec
	forfeited     prometheus.Counter
	transactions  prometheus.Counter
	rows          prometheus.Counter
	ledgerErrors  prometheus.Counter
	appendSeconds prometheus.Histogram
	batchRows     prometheus.Histogram
}

func newMetrics(h *Hub, reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "kvasir", "hub"
	m := &metrics{
		sessions: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "sessions_total",
			Help: "Worker sessions started (upgrades bridged to the backbone)."}),
		bridged: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "bytes_bridged_total",
			Help: "WebSocket message bytes bridged, by direction (to_worker, from_worker)."}, []string{"dir"}),
		bridgeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "bridge_errors_total",
			Help: "Sessions that ended on an error, by reason."}, []string{"reason"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "refused_upgrades_total",
			Help: "Worker upgrades refused before bridging, by reason."}, []string{"reason"}),
		ledgerBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "ledger_bytes_total",
			Help: "Bytes appended to the ledger, by kind (creditable, rejected)."}, []string{"kind"}),
		forfeited: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "forfeited_bytes_total",
			Help: "Creditable bytes forfeited after a failed verification (recorded as rejected)."}),
		transactions: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "ledger_transactions_total",
			Help: "Ledger append transactions (one per flush for all sessions)."}),
		rows: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "ledger_rows_total",
			Help: "Ledger rows appended."}),
		ledgerErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "ledger_errors_total",
			Help: "Failed ledger appends (the rows are sent again unchanged)."}),
		appendSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "ledger_append_seconds",
			Help: "Wall time of one ledger append transaction.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		batchRows: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "ledger_batch_rows",
			Help: "Rows per ledger append transaction.", Buckets: prometheus.ExponentialBuckets(1, 2, 14)}),
	}
	open := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "sessions_open",
		Help: "Worker sessions being bridged (or ended, awaiting their final ledger row)."}, func() float64 {
		h.mu.Lock()
		defer h.mu.Unlock()
		return float64(len(h.sessions) + len(h.finishing))
	})
	unsettled := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "unsettled_bytes",
		Help: "Creditable bytes held back from the ledger until settled."}, func() float64 {
		var n uint64
		for _, s := range h.live() {
			n += s.snapshot().Unsettled
		}
		return float64(n)
	})
	unacked := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "ledger_unacked_rows",
		Help: "Ledger rows waiting to be sent again after a failed append."}, func() float64 {
		n := 0
		for _, s := range h.live() {
			s.mu.Lock()
			if s.unacked != nil {
				n++
			}
			s.mu.Unlock()
		}
		return float64(n)
	})
	lag := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "ledger_lag_seconds",
		Help: "Age of the oldest ledger row waiting to be sent again after a failed append (0: none waits)."}, func() float64 {
		var oldest time.Time
		for _, s := range h.live() {
			s.mu.Lock()
			if s.unacked != nil && (oldest.IsZero() || s.unacked.Time.Before(oldest)) {
				oldest = s.unacked.Time
			}
			s.mu.Unlock()
		}
		if oldest.IsZero() {
			return 0
		}
		return time.Since(oldest).Seconds()
	})
	for _, c := range []prometheus.Collector{m.sessions, m.bridged, m.bridgeErrors, m.refused, m.ledgerBytes, m.forfeited,
		m.transactions, m.rows, m.ledgerErrors, m.appendSeconds, m.batchRows, open, unsettled, unacked, lag} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// MetricsHandler serves the hub's registry (Config.Registry, or the one
// the hub made) in the Prometheus text format; the hub mounts it on
// MetricsPath.
func (h *Hub) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(h.gatherer, promhttp.HandlerOpts{})
}

func (m *metrics) appended(rows int, d time.Duration, err error) {
	if err != nil {
		m.ledgerErrors.Inc()
		return
	}
	m.transactions.Inc()
	m.rows.Add(float64(rows))
	m.appendSeconds.Observe(d.Seconds())
	m.batchRows.Observe(float64(rows))
}

// refusalReason names why verifyGateway or the checks after it refused an
// upgrade, for kvasir_hub_refused_upgrades_total.
func refusalReason(err error) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "missing or malformed"):
		return "unsigned"
	case strings.Contains(msg, "bad MAC"):
		return "bad_mac"
	case strings.Contains(msg, "stale"), strings.Contains(msg, "time "):
		return "stale"
	case strings.Contains(msg, "replayed"):
		return "replayed"
	case strings.Contains(msg, "worker id"):
		return "bad_worker_id"
	case strings.Contains(msg, "no secret"):
		return "no_secret"
	}
	return "other"
}

// endReason classifies a session's end reason (bridge's return value)
// for kvasir_hub_bridge_errors_total; "" is a normal end.
func endReason(reason string) string {
	switch {
	case strings.HasPrefix(reason, "backbone link failed"):
		return "backbone_link"
	case strings.HasPrefix(reason, "backbone write"):
		return "backbone_write"
	case strings.HasPrefix(reason, "worker read"):
		return "worker_read"
	case strings.HasPrefix(reason, "worker write"):
		return "worker_write"
	case strings.HasPrefix(reason, "worker sent a text message"), strings.HasPrefix(reason, "backbone link kind"):
		return "bad_message"
	}
	return ""
}
