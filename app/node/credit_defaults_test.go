package node

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/app/status"
	"github.com/kvasir-ai/kvasir/backbone/hub"
	"github.com/kvasir-ai/kvasir/backbone/swarmtest"
	"github.com/kvasir-ai/kvasir/wallet"
	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

// gatewayCreditEvery is the gateway command's default crediting poll
// (backbone gateway --credit-every).
const gatewayCreditEvery = time.Second

// TestTwoWorkersCreditedWhileWorking (issue 21): a loopback swarm whose
// hub runs on the hub command's defaults (settle 30 s after metering and
// 128 later RESULTs, a 1 s flush), the gateway crediting every second (its
// default), and two nodes with the default statement sync (DefaultSyncEvery),
// both kept busy by a load that never pauses. Each node's local wallet is
// credited while it works, in its first session: the bytes each wallet had
// counted at time t are credited by t + settle + crediting interval + sync
// + 30 s. Credited nKVR are 7 x credited bytes and never more than the
// hub's ledger holds for the worker; the wallet never reports a mismatch
// during the work; and once the sessions end the wallets hold exactly the
// ledger's bytes x 7 nKVR.
func TestTwoWorkersCreditedWhileWorking(t *testing.T) {
	if testing.Short() {
		t.Skip("a loopback swarm on the hub's default settle rules (about a minute)")
	}
	sw, err := swarmtest.StartWith(t.TempDir(), swarmtest.Options{CreditEvery: gatewayCreditEvery})
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	bound := hub.DefaultSettleDelay + gatewayCreditEvery + DefaultSyncEvery + 30*time.Second

	type worker struct {
		n       *Node
		done    chan struct{}
		cancel  context.CancelFunc
		session string
		counted uint64 // own count at the reference time
	}
	ws := make([]*worker, 2)
	for i := range ws {
		data := t.TempDir()
		n, err := Open(Config{GatewayURL: sw.URL, CAFile: sw.CAFile, SliceDir: sw.SliceDir, DataDir: data, Threads: 1,
			KeyStore: wallet.FileStore{Dir: data}, StoreName: "file", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		w := &worker{n: n, done: make(chan struct{}), cancel: cancel}
		go func() { defer close(w.done); _ = n.Run(ctx) }()
		defer func() { cancel(); <-w.done; n.Close() }()
		ws[i] = w
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	if err := sw.WaitWorkers(wctx, 2); err != nil {
		t.Fatalf("workers never connected: %v", err)
	}
	sw.Load(16, 20*time.Millisecond)
	waitFor(t, "both workers serving", 30*time.Second, func() bool {
		return ws[0].n.Stats().Rows > 0 && ws[1].n.Stats().Rows > 0
	})
	// The reference time: what each wallet has counted a few seconds into
	// the work must be credited within the bound.
	time.Sleep(5 * time.Second)
	ref := time.Now()
	for i, w := range ws {
		s, err := w.n.Summary()
		if err != nil {
			t.Fatal(err)
		}
		w.counted, w.session = s.BytesServed, w.n.Stats().Session
		if w.counted == 0 || w.session == "" {
			t.Fatalf("worker %d: counted %d bytes in session %q", i, w.counted, w.session)
		}
	}

	credited := make([]time.Duration, len(ws))
	for pending := len(ws); pending > 0; {
		if time.Since(ref) > bound {
			t.Fatalf("after %v (settle %v + crediting %v + sync %v + 30 s) %d workers' bytes counted at the reference time are not credited",
				time.Since(ref).Round(time.Second), hub.DefaultSettleDelay, gatewayCreditEvery, DefaultSyncEvery, pending)
		}
		time.Sleep(time.Second)
		tot, err := sw.Ledger.Totals()
		if err != nil {
			t.Fatal(err)
		}
		for i, w := range ws {
			s, err := w.n.Summary()
			if err != nil {
				t.Fatal(err)
			}
			if s.Reconcile.Mismatch {
				t.Errorf("worker %d: mismatch during ordinary work after %v: %s", i, time.Since(ref).Round(time.Second), s.Reconcile.Explanation)
			}
			var ledgerBytes uint64
			for _, wt := range tot {
				if wt.ID == w.n.Identity().WorkerID {
					ledgerBytes = wt.Bytes
				}
			}
			if s.CreditedNKVR != walletapi.DefaultRateNKVRPerByte*s.CreditedBytes || s.CreditedBytes > ledgerBytes {
				t.Fatalf("worker %d: credited %d bytes for %d nKVR; the ledger holds %d creditable bytes (want credited <= ledger, 7 nKVR/byte)",
					i, s.CreditedBytes, s.CreditedNKVR, ledgerBytes)
			}
			if credited[i] == 0 && s.CreditedBytes+s.RejectedBytes >= w.counted {
				// Credited while working: still in its first session,
				// connected, and the load never stopped.
				st := w.n.Stats()
				if st.State != status.Connected || st.Session != w.session {
					t.Fatalf("worker %d credited, but no longer working in its first session: %+v", i, st)
				}
				credited[i] = time.Since(ref)
				pending--
				t.Logf("worker %d: %d bytes counted at the reference time credited after %v (wallet: %d credited, %d nKVR; ledger %d)",
					i, w.counted, credited[i].Round(time.Second), s.CreditedBytes, s.CreditedNKVR, ledgerBytes)
			}
		}
	}
	// Both kept working after the credit.
	rows := []uint64{ws[0].n.Stats().Rows, ws[1].n.Stats().Rows}
	waitFor(t, "both workers still serving", 10*time.Second, func() bool {
		return ws[0].n.Stats().Rows > rows[0] && ws[1].n.Stats().Rows > rows[1]
	})

	// End the sessions: the hub settles what it held at its next flush;
	// each wallet then holds exactly the ledger's bytes x 7 nKVR.
	sw.StopLoad()
	for _, w := range ws {
		w.cancel()
		<-w.done
	}
	for i, w := range ws {
		waitFor(t, "the wallet credited with the whole ledger", 20*time.Second, func() bool {
			if _, err := w.n.SyncNow(context.Background()); err != nil {
				t.Logf("sync: %v", err)
			}
			tot, err := sw.Ledger.Totals()
			if err != nil {
				t.Fatal(err)
			}
			s, err := w.n.Summary()
			if err != nil {
				t.Fatal(err)
			}
			for _, wt := range tot {
				if wt.ID == w.n.Identity().WorkerID {
					return wt.Bytes > 0 && s.CreditedBytes == wt.Bytes && s.CreditedNKVR == 7*wt.Bytes
				}
			}
			return false
		})
		t.Logf("worker %d: wallet equals the ledger after the session ended", i)
	}
}
