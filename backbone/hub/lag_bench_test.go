package hub

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/credit"
	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/backbone/pgstore/pgtest"
)

// timedMeter is a BatchMeter recording each append's duration and size.
type timedMeter struct {
	l    *ledger.Ledger
	mu   sync.Mutex
	took []time.Duration
	rows []int
}

func (m *timedMeter) Append(e ledger.Entry) error {
	return m.AppendAll(context.Background(), []ledger.Entry{e})
}

func (m *timedMeter) AppendAll(ctx context.Context, es []ledger.Entry) error {
	t0 := time.Now()
	err := m.l.AppendAll(ctx, es)
	m.mu.Lock()
	m.took = append(m.took, time.Since(t0))
	m.rows = append(m.rows, len(es))
	m.mu.Unlock()
	return err
}

// probe is a ledger.Reader that remembers the rows the gateway read, so
// that each row's credit delay (credit commit - append time) is known.
type probe struct {
	r    ledger.Reader
	mu   sync.Mutex
	seen map[int64]time.Time // id -> append time, until credited
}

func (p *probe) Read(ctx context.Context, after int64, limit int) ([]ledger.Entry, error) {
	es, err := p.r.Read(ctx, after, limit)
	p.mu.Lock()
	for _, e := range es {
		p.seen[e.ID] = e.Time
	}
	p.mu.Unlock()
	return es, err
}

// credited returns the delays of the rows at or below cursor, forgetting
// them.
func (p *probe) credited(cursor int64, now time.Time) []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []time.Duration
	for id, t := range p.seen {
		if id <= cursor {
			out = append(out, now.Sub(t))
			delete(p.seen, id)
		}
	}
	return out
}

func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// BenchmarkCreditLag1000Sessions: a real hub bridging 1,000 worker
// sessions (WebSockets on loopback, a DISPATCH to each every second from a
// stand-in backbone), flushing every second with settling off (so every
// session has a row each flush), and a gateway crediting every second
// from the same ledger, for KVASIR_LAG_SECONDS (default 20) seconds per
// backend. Reported: the hub's ledger transactions per second, rows per
// transaction and append time; the credit delay of each row (credit
// commit minus its append) at the median, p99 and maximum; the rows each
// poll found waiting.
//
//	go test ./backbone/hub/ -run '^$' -bench CreditLag1000 -benchtime 1x
func BenchmarkCreditLag1000Sessions(b *testing.B) {
	secs := 20
	if s, err := strconv.Atoi(os.Getenv("KVASIR_LAG_SECONDS")); err == nil && s > 0 {
		secs = s
	}
	const sessions = 1000
	for _, backend := range []string{"sqlite", "postgres"} {
		b.Run(backend, func(b *testing.B) {
			lpath := filepath.Join(b.TempDir(), "ledger.sqlite")
			wpath := filepath.Join(b.TempDir(), "wallets.sqlite")
			if backend == "postgres" {
				lpath = pgtest.DSN(b)
				wpath = lpath
			}
			l, err := ledger.Open(lpath)
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			m := &timedMeter{l: l}
			f := startFleet(b, sessions, m, func(c *Config) { c.FlushEvery = time.Second })
			pr := &probe{r: l, seen: map[int64]time.Time{}}
			gw, err := credit.Open(credit.Config{Path: wpath, Source: pr})
			if err != nil {
				b.Fatal(err)
			}
			defer gw.Close()
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			var delays []time.Duration
			var lagRows []int64
			var lagSecs []float64
			wg.Go(func() {
				t := time.NewTicker(time.Second)
				defer t.Stop()
				for {
					select {
					case <-ctx.Done():
						return
					case <-t.C:
					}
					r, err := gw.Credit(ctx)
					if err != nil && ctx.Err() == nil {
						b.Error(err)
					}
					delays = append(delays, pr.credited(r.Cursor, time.Now())...)
					st := gw.Stats()
					lagRows = append(lagRows, st.LagRows)
					lagSecs = append(lagSecs, st.LagSeconds)
				}
			})
			b.ResetTimer()
			start := time.Now()
			for time.Since(start) < time.Duration(secs)*time.Second {
				f.dispatchAll(b)
				time.Sleep(time.Second)
			}
			el := time.Since(start)
			cancel()
			wg.Wait()
			b.StopTimer()
			m.mu.Lock()
			txs, rows := len(m.took), 0
			for _, r := range m.rows {
				rows += r
			}
			took := quantile(m.took, 0.5)
			took99 := quantile(m.took, 0.99)
			m.mu.Unlock()
			var maxLag int64
			var sumLag int64
			for _, r := range lagRows {
				sumLag += r
				maxLag = max(maxLag, r)
			}
			b.ReportMetric(float64(txs)/el.Seconds(), "hub-tx/s")
			b.ReportMetric(float64(rows)/float64(max(txs, 1)), "rows/tx")
			b.ReportMetric(float64(took.Microseconds())/1000, "append-p50-ms")
			b.ReportMetric(float64(took99.Microseconds())/1000, "append-p99-ms")
			b.ReportMetric(quantile(delays, 0.5).Seconds(), "delay-p50-s")
			b.ReportMetric(quantile(delays, 0.99).Seconds(), "delay-p99-s")
			b.ReportMetric(quantile(delays, 1).Seconds(), "delay-max-s")
			b.ReportMetric(float64(sumLag)/float64(max(len(lagRows), 1)), "lag-rows-mean")
			b.ReportMetric(float64(maxLag), "lag-rows-max")
			b.Logf("%s: %d sessions, %v: %d hub transactions (%d rows), %d rows credited in %d polls; lag seconds at polls %v",
				backend, sessions, el.Round(time.Second), txs, rows, len(delays), len(lagRows), fmtSecs(lagSecs))
		})
	}
}

func fmtSecs(xs []float64) string {
	s := ""
	for i, x := range xs {
		if i == 8 {
			return s + " ..."
		}
		s += fmt.Sprintf(" %.2f", x)
	}
	return s
}
