package node

import (
	"context"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/app/status"
	"github.com/kvasir-ai/kvasir/backbone/swarmtest"
	"github.com/kvasir-ai/kvasir/wallet"
	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

func waitFor(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestNodeInSwarm runs a real node (file key store, SQLite wallet, slice
// directory with hash checks, worker over TLS) in a loopback swarm (hub,
// gateway, dispatcher, ledger, crediting), serves load, and checks that
// what the wallet shows matches the hub's ledger: credited bytes equal the
// ledger's creditable bytes for this worker, at 7 nKVR per byte.
func TestNodeInSwarm(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a loopback swarm")
	}
	sw, err := swarmtest.Start(t.TempDir(), 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	data := t.TempDir()
	n, err := Open(Config{GatewayURL: sw.URL, CAFile: sw.CAFile, SliceDir: sw.SliceDir, DataDir: data, Threads: 1,
		KeyStore: wallet.FileStore{Dir: data}, StoreName: "file", SyncEvery: 300 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	info := n.Slice()
	if info.Layers != 1 || info.Experts != sw.Model.NExpert || !info.Verified || info.Bad != 0 || info.Bytes == 0 {
		t.Errorf("slice info %+v, want 1 layer of %d verified experts", info, sw.Model.NExpert)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = n.Run(ctx) }()
	defer func() { cancel(); <-done; n.Close() }()

	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	if err := sw.WaitWorkers(wctx, 1); err != nil {
		t.Fatalf("worker never connected: %v (stats %+v)", err, n.Stats())
	}
	waitFor(t, "connected state", 10*time.Second, func() bool { return n.Stats().State == status.Connected })
	if s := n.Stats(); s.Gateway != sw.URL[len("wss://"):] || s.Reason != "" {
		t.Errorf("stats after connect %+v", s)
	}
	const rows = 16
	sw.Load(rows, 20*time.Millisecond)
	waitFor(t, "rows served", 20*time.Second, func() bool { return n.Stats().Rows >= 20*rows })
	sw.StopLoad()
	waitFor(t, "the worker to go quiet", 10*time.Second, func() bool {
		a := n.Stats()
		time.Sleep(300 * time.Millisecond)
		return n.Stats().Rows == a.Rows
	})
	st := n.Stats()
	if st.Requests == 0 || st.BytesIn == 0 || st.BytesOut == 0 || st.Session == "" || st.RTT <= 0 && st.Requests < 1 {
		t.Errorf("worker stats %+v", st)
	}
	if ds := sw.Disp.Stats(); ds.ExpertsRemote == 0 {
		t.Errorf("dispatcher used no remote expert outputs: %+v", ds)
	}

	// End the session: on the hub's default settle rules a quiet session's
	// last bytes settle 30 s after its last RESULT, an ended one's at the
	// next flush. Then the hub's ledger for this worker, once it has
	// flushed everything, and the wallet synced from the gateway.
	cancel()
	<-done
	id := n.Identity().WorkerID
	var ledgerBytes, rejected uint64
	waitFor(t, "wallet credited with the whole ledger", 20*time.Second, func() bool {
		if _, err := n.SyncNow(context.Background()); err != nil {
			t.Logf("sync: %v", err)
		}
		tot, err := sw.Ledger.Totals()
		if err != nil {
			t.Fatal(err)
		}
		ledgerBytes, rejected = 0, 0
		for _, w := range tot {
			if w.ID == id {
				ledgerBytes, rejected = w.Bytes, w.RejectedBytes
			}
		}
		s, err := n.Summary()
		if err != nil {
			t.Fatal(err)
		}
		return ledgerBytes > 0 && s.CreditedBytes == ledgerBytes
	})
	s, err := n.Summary()
	if err != nil {
		t.Fatal(err)
	}
	if s.CreditedNKVR != walletapi.DefaultRateNKVRPerByte*s.CreditedBytes || s.PendingNKVR != s.CreditedNKVR || s.Statements == 0 {
		t.Errorf("credited %d nKVR for %d bytes (pending %d, %d statements), want 7 nKVR/byte", s.CreditedNKVR, s.CreditedBytes, s.PendingNKVR, s.Statements)
	}
	// The wallet's own count (OnServed: DISPATCH and RESULT message sizes)
	// equals what the hub metered for those frames: creditable plus
	// rejected (late results, never paid); it is below the worker's total
	// traffic by the HELLO/WELCOME/PAUSE/ping messages.
	if s.BytesServed != ledgerBytes+rejected || s.BytesServed >= st.BytesIn+st.BytesOut || s.RejectedBytes != rejected {
		t.Errorf("own count %d, ledger %d + %d rejected (wallet says %d), worker traffic %d",
			s.BytesServed, ledgerBytes, rejected, s.RejectedBytes, st.BytesIn+st.BytesOut)
	}
	if s.Address != n.Identity().Address || s.Reconcile.Mismatch {
		t.Errorf("wallet %+v", s)
	}
	t.Logf("served %d rows in %d requests; worker bytes in %d out %d; wallet own count %d; ledger %d creditable + %d rejected; credited %s",
		st.Rows, st.Requests, st.BytesIn, st.BytesOut, s.BytesServed, ledgerBytes, rejected, status.FormatKVR(s.CreditedNKVR))
}

// TestNodeProvisioning starts a node with an empty slice folder and a
// quota: the backbone assigns experts, the worker downloads and verifies
// them, the snapshot reports the download, and the node then serves.
func TestNodeProvisioning(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a loopback swarm")
	}
	sw, err := swarmtest.Start(t.TempDir(), 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	data := t.TempDir()
	dir := filepath.Join(t.TempDir(), "slice")
	const quota = 64 << 20
	n, err := Open(Config{GatewayURL: sw.URL, CAFile: sw.CAFile, SliceDir: dir, QuotaBytes: quota, DataDir: data, Threads: 1,
		KeyStore: wallet.FileStore{Dir: data}, StoreName: "file", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if info := n.Slice(); info.Experts != 0 || info.QuotaBytes != quota {
		t.Errorf("empty slice info %+v", info)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = n.Run(ctx) }()
	defer func() { cancel(); <-done; n.Close() }()

	// The download counters and the store's holdings are read separately:
	// wait until both show the whole assignment.
	var s status.Snapshot
	var info status.SliceInfo
	waitFor(t, "the assignment downloaded", 30*time.Second, func() bool {
		s, info = n.Stats(), n.Slice()
		return s.DownloadBytesTotal > 0 && !s.Downloading() && info.Experts == s.DownloadExpertsTotal
	})
	if info.Experts != s.DownloadExpertsTotal || info.Experts == 0 || info.Bytes != s.DownloadBytesTotal ||
		info.Bytes > quota || info.Layers == 0 || info.Bad != 0 {
		t.Errorf("after download: slice %+v, stats %+v", info, s)
	}
	if got := s.DownloadLine(); !strings.HasPrefix(got, "assigned experts held: ") || !strings.HasSuffix(got, "(100%)") {
		t.Errorf("download line %q", got)
	}
	sw.Load(16, 20*time.Millisecond)
	waitFor(t, "rows served from downloaded experts", 20*time.Second, func() bool { return n.Stats().Rows > 0 })
	t.Logf("downloaded %d experts (%d bytes) in %d layers, then served %d rows", info.Experts, info.Bytes, info.Layers, n.Stats().Rows)
}

// TestWithDefaults: a first run with nothing configured gets the default
// gateway ($KVASIR_DEFAULT_GATEWAY here, else PublicGateway), the data
// folder under the user config folder, the slice folder inside it and
// provisioning on with the default quota; a slice folder given without a
// quota is served as it is.
func TestWithDefaults(t *testing.T) {
	cfgHome := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", cfgHome)
	t.Setenv("HOME", t.TempDir())
	t.Setenv(EnvDefaultGateway, "")
	c, err := Config{}.WithDefaults()
	data := filepath.Join(cfgHome, "kvasir")
	if err != nil || PublicGateway != "wss://gate.kvasir-ai.net:443" || c.GatewayURL != PublicGateway || c.DataDir != data ||
		c.SliceDir != filepath.Join(data, "slice") || c.QuotaBytes != 4_000_000_000 || c.CAFile != "" {
		t.Fatalf("first run: %+v %v", c, err)
	}
	t.Setenv(EnvDefaultGateway, "wss://127.0.0.1:8443")
	if c, _ := (Config{}).WithDefaults(); c.GatewayURL != "wss://127.0.0.1:8443" {
		t.Errorf("with %s: %+v", EnvDefaultGateway, c)
	}
	c, _ = Config{GatewayURL: "wss://gw:1", SliceDir: "/srv/slice", DataDir: "/d"}.WithDefaults()
	if c.GatewayURL != "wss://gw:1" || c.SliceDir != "/srv/slice" || c.QuotaBytes != 0 || c.DataDir != "/d" {
		t.Errorf("explicit settings changed: %+v", c)
	}
}

// TestNodeExplainsUnreachableGateway runs a real node against a loopback
// port that refuses and against a TLS gateway whose certificate this
// machine does not trust: the status says which, in words, and that the
// worker retries.
func TestNodeExplainsUnreachableGateway(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	srv := httptest.NewUnstartedServer(http.NotFoundHandler())
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	defer srv.Close()
	for _, c := range []struct{ url, says string }{
		{"wss://" + closed, closed + " refused the connection: the gateway is down or the address is wrong; retrying "},
		{"wss://" + srv.Listener.Addr().String(), "TLS: " + srv.Listener.Addr().String() + "'s certificate is not signed by an authority this device trusts"},
	} {
		data := t.TempDir()
		n, err := Open(Config{GatewayURL: c.url, SliceDir: "unused", DataDir: data, Threads: 1,
			KeyStore: wallet.FileStore{Dir: data}, StoreName: "file", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			LoadSlice: func(string, int) (*Slice, error) {
				return &Slice{Computer: zeroComputer{}, ModelID: "m", Backend: "cpu"}, nil
			}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = n.Run(ctx) }()
		waitFor(t, "an explained dial failure", 10*time.Second, func() bool { return strings.Contains(n.Stats().Reason, c.says) })
		// Waiting to redial is Offline, not "connecting", and the delay
		// counts down in whole seconds (or says "now").
		if s := n.Stats(); s.State != status.Offline || !regexp.MustCompile(`; retrying (in [0-9]+ s|now)$`).MatchString(s.Reason) {
			t.Errorf("%s: %+v", c.url, s)
		}
		t.Logf("%s: %s", c.url, n.Stats().Reason)
		cancel()
		<-done
		n.Close()
	}
}
