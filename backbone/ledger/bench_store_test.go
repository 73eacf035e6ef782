package ledger

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/pgstore/pgtest"
)

// BenchmarkLedgerAppend measures appends per second on each backend: one
// row per transaction (Append) and the hub's flush, one transaction of 100
// or 1000 rows (AppendAll), by 1, 2 or 4 hubs appending concurrently to
// one ledger (on SQLite, four connections to the file). rows/s is the
// total over all hubs; tx/s the transactions.
//
//	go test ./backbone/ledger/ -run '^$' -bench LedgerAppend -benchtime 3s
func BenchmarkLedgerAppend(b *testing.B) {
	for _, backend := range []string{"sqlite", "postgres"} {
		for _, batch := range []int{1, 100, 1000} {
			for _, hubs := range []int{1, 2, 4} {
				b.Run(fmt.Sprintf("%s/batch=%d/hubs=%d", backend, batch, hubs), func(b *testing.B) {
					path := filepath.Join(b.TempDir(), "ledger.sqlite")
					if backend == "postgres" {
						path = pgtest.DSN(b)
					}
					ls := make([]*Ledger, hubs) // one store (one connection pool) per hub
					for i := range ls {
						l, err := Open(path)
						if err != nil {
							b.Fatal(err)
						}
						defer l.Close()
						ls[i] = l
					}
					var txs int64
					var mu sync.Mutex
					start := time.Now()
					b.ResetTimer()
					var wg sync.WaitGroup
					for h := range hubs {
						wg.Go(func() {
							es := make([]Entry, batch)
							for i := range es {
								es[i] = Entry{SessionID: fmt.Sprintf("h%d-s%d", h, i), WorkerID: hexKey(byte(i)), BytesIn: 1000, BytesOut: 2000}
							}
							n := 0
							for i := h; i < b.N; i += hubs {
								for j := range es {
									es[j].Seq = uint64(i + 1)
								}
								if err := ls[h].AppendAll(context.Background(), es); err != nil {
									b.Error(err)
									return
								}
								n++
							}
							mu.Lock()
							txs += int64(n)
							mu.Unlock()
						})
					}
					wg.Wait()
					el := time.Since(start).Seconds()
					b.ReportMetric(float64(txs)/el, "tx/s")
					b.ReportMetric(float64(txs*int64(batch))/el, "rows/s")
				})
			}
		}
	}
}
