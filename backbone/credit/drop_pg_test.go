package credit

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/backbone/pgstore/pgtest"
)

// TestPGConnectionDrops: a hub appends batches and a gateway credits
// through a proxy that cuts their PostgreSQL connections in the middle of
// transactions: before a statement, and around COMMIT, either before the
// server sees it (the transaction aborts) or right after (the server
// commits, the client never hears). The hub sends a failed batch again
// unchanged, as hub.Hub does; the gateway just polls again. Once the cuts
// stop, the ledger holds every batch exactly once and the wallets hold
// exactly rate x the ledger, per worker.
func TestPGConnectionDrops(t *testing.T) {
	dsn := pgtest.DSN(t)
	direct, err := ledger.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if s, err := Open(Config{Path: dsn, Source: direct}); err != nil {
		t.Fatal(err)
	} else {
		s.Close()
	}
	proxy, pdsn := pgtest.NewProxy(t, dsn)
	rng := rand.New(rand.NewPCG(21, 21))    // the hub's rows
	cutRng := rand.New(rand.NewPCG(22, 22)) // the proxy's cuts (its hook runs one call at a time)
	var commitsLost, commitsAborted, cuts atomic.Int64
	var cutting atomic.Bool
	cutting.Store(true)
	proxy.Hook = func(typ byte, body []byte) pgtest.Action {
		if !cutting.Load() {
			return pgtest.Forward
		}
		if typ == 'Q' && bytes.Contains(bytes.ToLower(body), []byte("commit")) {
			switch r := cutRng.IntN(10); {
			case r < 3:
				commitsLost.Add(1)
				return pgtest.DropAfter
			case r < 5:
				commitsAborted.Add(1)
				return pgtest.DropBefore
			}
			return pgtest.Forward
		}
		if cutRng.IntN(60) == 0 {
			cuts.Add(1)
			return pgtest.DropBefore
		}
		return pgtest.Forward
	}
	openRetry := func(what string, open func() error) {
		for i := 0; ; i++ {
			err := open()
			if err == nil {
				return
			}
			if i == 50 {
				t.Fatalf("%s through the proxy: %v", what, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	var hubL *ledger.Ledger
	openRetry("ledger", func() (err error) { hubL, err = ledger.Open(pdsn); return })
	defer hubL.Close()
	var gw *Service
	openRetry("wallets", func() (err error) {
		gw, err = Open(Config{Path: pdsn, Source: direct, RateNKVRPerByte: helperRate, Batch: 7})
		return
	})
	defer gw.Close()

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var creditErrs atomic.Int64
	wg.Go(func() {
		for ctx.Err() == nil {
			if _, err := gw.Credit(ctx); err != nil {
				creditErrs.Add(1)
			}
			time.Sleep(time.Millisecond)
		}
	})
	want := map[string]uint64{}
	appendErrs := 0
	seq := map[string]uint64{}
	for round := range 150 {
		var es []ledger.Entry
		for i := range 5 {
			sess := fmt.Sprintf("s%d", (round/30)*5+i) // sessions come and go
			seq[sess]++
			e := ledger.Entry{SessionID: sess, Seq: seq[sess], WorkerID: workerID(i % 3),
				BytesIn: uint64(rng.IntN(5000)), BytesOut: uint64(1 + rng.IntN(5000)), Final: seq[sess] == 30}
			es = append(es, e)
			want[e.WorkerID] += e.BytesIn + e.BytesOut
		}
		for {
			if err := hubL.AppendAll(context.Background(), es); err == nil {
				break
			}
			appendErrs++
		}
	}
	cutting.Store(false)
	cancel()
	wg.Wait()
	for {
		if _, err := gw.Credit(context.Background()); err == nil {
			break
		}
	}
	tot, err := direct.Totals()
	if err != nil {
		t.Fatal(err)
	}
	for _, wt := range tot {
		if wt.Bytes != want[wt.ID] {
			t.Errorf("worker %s: %d creditable bytes in the ledger, appended %d", wt.ID[:8], wt.Bytes, want[wt.ID])
		}
	}
	if len(tot) != len(want) {
		t.Errorf("%d workers in the ledger, want %d", len(tot), len(want))
	}
	checkCreditedExactly(t, direct, dsn)
	if commitsLost.Load() == 0 || commitsAborted.Load() == 0 || appendErrs == 0 || creditErrs.Load() == 0 {
		t.Fatalf("too few cuts: %d commits lost, %d aborted, %d other; %d append errors, %d credit errors",
			commitsLost.Load(), commitsAborted.Load(), cuts.Load(), appendErrs, creditErrs.Load())
	}
	t.Logf("%d connections cut: %d after COMMIT was sent (answer lost), %d before it, %d elsewhere; %d failed appends sent again, %d failed credits",
		proxy.Cuts(), commitsLost.Load(), commitsAborted.Load(), cuts.Load(), appendErrs, creditErrs.Load())
}
