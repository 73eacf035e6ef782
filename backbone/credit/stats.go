package credit

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvasir-ai/kvasir/backbone/ledger"
)

// Stats are a Service's crediting counters since Open and its lag as seen
// at the last poll (Credit call).
type Stats struct {
	Rows       uint64 // ledger rows credited by this service
	Bytes      uint64 // creditable bytes credited
	NKVR       uint64 // nKVR credited
	Statements uint64 // statements written
	Batches    uint64 // crediting transactions committed
	Conflicts  uint64 // batches abandoned because another gateway moved the cursor first (then retried)
	Errors     uint64 // polls that failed (ledger unreachable, bad rows, database errors)
	Cursor     int64  // the cursor after the last commit or poll

	// LagRows is the number of distinct ledger rows the last poll found
	// after the cursor (uncredited when it started, or appended while it
	// ran), whoever credited them; a failed poll keeps the larger of this
	// and the previous value.
	LagRows int64
	// LagSeconds is the age, when the last poll started, of the oldest
	// ledger row not yet credited (0 when none was waiting). While polls
	// fail it keeps growing from the oldest row known to wait.
	LagSeconds float64
	// LastCaughtUp is when a poll last ended with nothing left to credit.
	LastCaughtUp time.Time
}

// pass is what one Credit call saw.
type pass struct {
	start   time.Time
	oldest  time.Time // append time of the first row after the cursor at the first read
	read    bool      // a read succeeded
	maxSeen int64     // highest ledger id seen
	rows    int64     // distinct rows seen after the cursor
	failed  bool
	cursor  int64
}

func (p *pass) saw(cur int64, es []ledger.Entry) {
	if !p.read && len(es) > 0 {
		p.oldest = es[0].Time
	}
	p.read = true
	p.cursor = cur
	if p.maxSeen < cur {
		p.maxSeen = cur
	}
	for _, e := range es {
		if e.ID > p.maxSeen {
			p.rows++
			p.maxSeen = e.ID
		}
	}
}

type stats struct {
	rows, bytes, nkvr, statements, batches, conflicts, errors atomic.Uint64

	mu            sync.Mutex
	cursor        int64
	lagRows       int64
	lagSeconds    float64
	oldestPending time.Time // append time of the oldest row known to wait (zero: none known)
	caughtUp      time.Time

	delayOnce sync.Once
	delay     prometheus.Histogram // seconds from a row's append to its credit commit
}

func (st *stats) histogram() prometheus.Histogram {
	st.delayOnce.Do(func() {
		st.delay = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "kvasir", Subsystem: "gateway",
			Name: "credit_delay_seconds", Help: "Seconds from a ledger row's append (its time) to the commit that credited it.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 16)}) // 10 ms .. 5.5 min
	})
	return st.delay
}

func (st *stats) committed(r Result, es []ledger.Entry, now time.Time) {
	st.rows.Add(uint64(r.Rows))
	st.bytes.Add(r.Bytes)
	st.nkvr.Add(r.NKVR)
	st.statements.Add(uint64(r.Statements))
	st.batches.Add(1)
	h := st.histogram()
	for _, e := range es {
		h.Observe(max(now.Sub(e.Time).Seconds(), 0))
	}
	st.mu.Lock()
	st.cursor = r.Cursor
	st.mu.Unlock()
}

func (st *stats) endPass(p pass, now time.Time) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if p.read && p.cursor > st.cursor {
		st.cursor = p.cursor
	}
	switch {
	case !p.failed:
		st.lagRows = p.rows
		st.lagSeconds = 0
		if !p.oldest.IsZero() {
			st.lagSeconds = max(p.start.Sub(p.oldest).Seconds(), 0)
		}
		st.oldestPending = time.Time{}
		st.caughtUp = now
	default:
		st.lagRows = max(st.lagRows, p.rows)
		if st.oldestPending.IsZero() || (!p.oldest.IsZero() && p.oldest.Before(st.oldestPending)) {
			st.oldestPending = p.oldest
		}
		if !st.oldestPending.IsZero() {
			st.lagSeconds = max(p.start.Sub(st.oldestPending).Seconds(), 0)
		}
	}
}

// Stats returns the service's counters and lag.
func (s *Service) Stats() Stats {
	st := &s.stats
	st.mu.Lock()
	defer st.mu.Unlock()
	return Stats{Rows: st.rows.Load(), Bytes: st.bytes.Load(), NKVR: st.nkvr.Load(), Statements: st.statements.Load(),
		Batches: st.batches.Load(), Conflicts: st.conflicts.Load(), Errors: st.errors.Load(), Cursor: st.cursor,
		LagRows: st.lagRows, LagSeconds: st.lagSeconds, LastCaughtUp: st.caughtUp}
}

// Collector exports the service's Stats as Prometheus series (namespace
// kvasir_gateway), read at each scrape:
//
//	kvasir_gateway_credit_rows_total          ledger rows credited
//	kvasir_gateway_credit_bytes_total         creditable bytes credited
//	kvasir_gateway_credit_nkvr_total          nKVR credited
//	kvasir_gateway_credit_statements_total    statements signed
//	kvasir_gateway_credit_transactions_total  crediting transactions committed
//	kvasir_gateway_credit_conflicts_total     batches another gateway credited first
//	kvasir_gateway_credit_errors_total        failed polls
//	kvasir_gateway_credit_cursor              id of the last ledger row credited
//	kvasir_gateway_credit_lag_rows            rows the last poll found after the cursor
//	kvasir_gateway_credit_lag_seconds         age of the oldest uncredited row at the last poll
//	kvasir_gateway_credit_caught_up_timestamp_seconds  when a poll last left nothing to credit
//	kvasir_gateway_credit_delay_seconds       histogram: row append -> credit commit
func (s *Service) Collector() prometheus.Collector { return &collector{s: s} }

type collector struct{ s *Service }

var (
	descCounters = map[string]*prometheus.Desc{}
	descNames    = []struct{ name, help string }{
		{"credit_rows_total", "Ledger rows credited by this gateway."},
		{"credit_bytes_total", "Creditable bytes credited by this gateway."},
		{"credit_nkvr_total", "nKVR credited by this gateway."},
		{"credit_statements_total", "Signed statements written by this gateway."},
		{"credit_transactions_total", "Crediting transactions committed by this gateway."},
		{"credit_conflicts_total", "Batches abandoned because another gateway moved the shared cursor first (retried)."},
		{"credit_errors_total", "Crediting polls that failed (ledger unreachable, bad rows, database errors)."},
	}
	descCursor   = prometheus.NewDesc("kvasir_gateway_credit_cursor", "Id of the last ledger row credited.", nil, nil)
	descLagRows  = prometheus.NewDesc("kvasir_gateway_credit_lag_rows", "Ledger rows the last poll found after the cursor.", nil, nil)
	descLagSecs  = prometheus.NewDesc("kvasir_gateway_credit_lag_seconds", "Age of the oldest uncredited ledger row when the last poll started (0: none waited).", nil, nil)
	descCaughtUp = prometheus.NewDesc("kvasir_gateway_credit_caught_up_timestamp_seconds", "Unix time a poll last ended with nothing left to credit.", nil, nil)
)

func init() {
	for _, d := range descNames {
		descCounters[d.name] = prometheus.NewDesc("kvasir_gateway_"+d.name, d.help, nil, nil)
	}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range descNames {
		ch <- descCounters[d.name]
	}
	ch <- descCursor
	ch <- descLagRows
	ch <- descLagSecs
	ch <- descCaughtUp
	c.s.stats.histogram().Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	for name, v := range map[string]uint64{"credit_rows_total": st.Rows, "credit_bytes_total": st.Bytes, "credit_nkvr_total": st.NKVR,
		"credit_statements_total": st.Statements, "credit_transactions_total": st.Batches, "credit_conflicts_total": st.Conflicts,
		"credit_errors_total": st.Errors} {
		ch <- prometheus.MustNewConstMetric(descCounters[name], prometheus.CounterValue, float64(v))
	}
	ch <- prometheus.MustNewConstMetric(descCursor, prometheus.GaugeValue, float64(st.Cursor))
	ch <- prometheus.MustNewConstMetric(descLagRows, prometheus.GaugeValue, float64(st.LagRows))
	ch <- prometheus.MustNewConstMetric(descLagSecs, prometheus.GaugeValue, st.LagSeconds)
	var caught float64
	if !st.LastCaughtUp.IsZero() {
		caught = float64(st.LastCaughtUp.UnixNano()) / 1e9
	}
	ch <- prometheus.MustNewConstMetric(descCaughtUp, prometheus.GaugeValue, caught)
	c.s.stats.histogram().Collect(ch)
}
