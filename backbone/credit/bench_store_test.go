package credit

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/backbone/pgstore/pgtest"
)

// BenchmarkCreditGateways measures credited ledger rows per second on each
// backend with 1, 2 and 4 gateways crediting one wallets store at once
// from one ledger (read directly, not over HTTP): 20,000 rows of 200
// workers, 1000 rows per crediting transaction (DefaultBatch). Each
// iteration credits the whole ledger into a fresh wallets store; every
// run checks the total is exactly rate x the ledger.
//
//	go test ./backbone/credit/ -run '^$' -bench CreditGateways -benchtime 3x
func BenchmarkCreditGateways(b *testing.B) {
	const rows, workers = 20000, 200
	for _, backend := range []string{"sqlite", "postgres"} {
		b.Run(backend, func(b *testing.B) {
			lpath := filepath.Join(b.TempDir(), "ledger.sqlite")
			if backend == "postgres" {
				lpath = pgtest.DSN(b)
			}
			l, err := ledger.Open(lpath)
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			es := make([]ledger.Entry, 0, 1000)
			var want uint64
			for i := range rows {
				e := ledger.Entry{SessionID: fmt.Sprint("s", i%1000), Seq: uint64(i/1000 + 1), WorkerID: workerID(i % workers),
					BytesIn: uint64(1000 + i%777), BytesOut: uint64(2000 + i%555)}
				want += e.BytesIn + e.BytesOut
				if es = append(es, e); len(es) == cap(es) {
					if err := l.AppendAll(context.Background(), es); err != nil {
						b.Fatal(err)
					}
					es = es[:0]
				}
			}
			for _, gws := range []int{1, 2, 4} {
				b.Run(fmt.Sprintf("gateways=%d", gws), func(b *testing.B) {
					var total time.Duration
					var conflicts atomic.Uint64
					for i := 0; i < b.N; i++ {
						b.StopTimer()
						wpath := filepath.Join(b.TempDir(), "wallets.sqlite")
						if backend == "postgres" {
							wpath = pgtest.DSN(b)
						}
						ss := make([]*Service, gws)
						for g := range ss {
							if ss[g], err = Open(Config{Path: wpath, Source: l, RateNKVRPerByte: 7}); err != nil {
								b.Fatal(err)
							}
						}
						b.StartTimer()
						t0 := time.Now()
						var wg sync.WaitGroup
						for _, s := range ss {
							wg.Go(func() {
								for {
									r, err := s.CreditBatch(context.Background())
									if errors.Is(err, ErrConflict) {
										conflicts.Add(1)
										continue
									}
									if err != nil {
										b.Error(err)
										return
									}
									if r.Rows == 0 {
										return
									}
								}
							})
						}
						wg.Wait()
						total += time.Since(t0)
						b.StopTimer()
						_, paid := creditedTotal(&testing.T{}, ss[0])
						if paid != 7*want {
							b.Fatalf("credited %d nKVR, want %d", paid, 7*want)
						}
						for _, s := range ss {
							s.Close()
						}
						b.StartTimer()
					}
					b.ReportMetric(float64(rows*b.N)/total.Seconds(), "rows/s")
					b.ReportMetric(float64(conflicts.Load())/float64(b.N), "conflicts/run")
				})
			}
		})
	}
}
