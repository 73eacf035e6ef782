package credit

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/wallet"
	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

// serveWallets credits workers 1 and 2 and serves the wallet API over TLS
// on loopback.
func serveWallets(t *testing.T) (*Service, *httptest.Server) {
	t.Helper()
	l, s := openPair(t, t.TempDir(), 7)
	for i, e := range []ledger.Entry{
		{SessionID: "a1", WorkerID: workerID(1), BytesIn: 1000, BytesOut: 2000},
		{SessionID: "b1", WorkerID: workerID(2), BytesIn: 5, BytesOut: 5, RejectedBytes: 99},
		{SessionID: "a1", WorkerID: workerID(1), BytesIn: 300, Final: true},
	} {
		if err := l.Append(e); err != nil {
			t.Fatal(err)
		}
		if i != 1 { // two credit rounds -> worker 1 gets statements 1 and 2
			if _, err := s.Credit(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	srv := httptest.NewTLSServer(s.Handler(HandlerOptions{}))
	t.Cleanup(srv.Close)
	return s, srv
}

func get(t *testing.T, srv *httptest.Server, target string, h http.Header) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest("GET", srv.URL+target, nil)
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

func TestWalletSyncOverTLS(t *testing.T) {
	s, srv := serveWallets(t)
	id := wallet.NewIdentity(workerKey(1))
	w, err := wallet.Open(filepath.Join(t.TempDir(), "w.db"), id, wallet.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	n, err := w.Sync(context.Background(), srv.Client(), srv.URL, id.Key)
	if err != nil || n != 2 {
		t.Fatalf("Sync = %d, %v; want 2 statements", n, err)
	}
	sum, err := w.Summary()
	if err != nil {
		t.Fatal(err)
	}
	// Worker 1: 1000 + 2000 + 300 = 3300 bytes x 7 = 23100 nKVR.
	if sum.CreditedBytes != 3300 || sum.CreditedNKVR != 23100 || sum.Statements != 2 || sum.Gateway != hex.EncodeToString(s.PublicKey()) {
		t.Fatalf("summary %+v", sum)
	}
	if n, err := w.Sync(context.Background(), srv.Client(), srv.URL, id.Key); err != nil || n != 0 {
		t.Fatalf("second Sync = %d, %v", n, err)
	}
}

func TestWalletRequestsRefused(t *testing.T) {
	_, srv := serveWallets(t)
	now := time.Now()
	sign := func(i int, target string, at time.Time) http.Header {
		h, err := walletapi.SignRequest(workerKey(i), "GET", target, at)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	target := walletapi.PathStatements + "?after=0"

	// Unsigned.
	if code, _ := get(t, srv, target, nil); code != 401 {
		t.Errorf("unsigned: %d, want 401", code)
	}
	// Forged: worker 2 signs but claims worker 1's key.
	h := sign(2, target, now)
	h.Set(walletapi.HeaderKey, workerID(1))
	if code, _ := get(t, srv, target, h); code != 401 {
		t.Errorf("forged key: %d, want 401", code)
	}
	// Forged: a flipped signature bit.
	h = sign(1, target, now)
	sig := []byte(h.Get(walletapi.HeaderSig))
	sig[0] ^= 1
	h.Set(walletapi.HeaderSig, string(sig))
	if code, _ := get(t, srv, target, h); code != 401 {
		t.Errorf("bad signature: %d, want 401", code)
	}
	// A signature for after=0 replayed against another query.
	h = sign(1, target, now)
	if code, _ := get(t, srv, walletapi.PathStatements+"?after=1", h); code != 401 {
		t.Errorf("query swapped: %d, want 401", code)
	}
	// Stale.
	if code, _ := get(t, srv, target, sign(1, target, now.Add(-2*walletapi.DefaultMaxSkew))); code != 401 {
		t.Errorf("stale: %d, want 401", code)
	}
	// Valid once, then replayed.
	h = sign(1, target, now)
	code, body := get(t, srv, target, h)
	if code != 200 {
		t.Fatalf("valid: %d %s", code, body)
	}
	var page walletapi.StatementsPage
	if err := json.Unmarshal(body, &page); err != nil || len(page.Statements) != 2 {
		t.Fatalf("valid page: %v %s", err, body)
	}
	if code, _ := get(t, srv, target, h); code != 401 {
		t.Errorf("replay: %d, want 401", code)
	}
	// Worker 2 sees only its own statement, whatever it asks for.
	code, body = get(t, srv, target, sign(2, target, now))
	if err := json.Unmarshal(body, &page); code != 200 || err != nil || len(page.Statements) != 1 {
		t.Fatalf("worker 2: %d %v %s", code, err, body)
	}
	var gw [32]byte
	b, _ := hex.DecodeString(page.Gateway)
	copy(gw[:], b)
	st, err := walletapi.Open(gw[:], page.Statements[0])
	if err != nil || st.Worker != workerID(2) || st.Bytes != 10 || st.RejectedBytes != 99 {
		t.Fatalf("worker 2 statement %+v %v", st, err)
	}
	other := walletapi.PathStatements + "?after=0&worker=" + workerID(1)
	if code, _ := get(t, srv, other, sign(2, other, now)); code != 400 {
		t.Errorf("worker param: %d, want 400", code)
	}
	// No method changes a wallet.
	req, _ := http.NewRequest("POST", srv.URL+target, strings.NewReader("{}"))
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 {
		t.Errorf("POST: %d, want 405", resp.StatusCode)
	}
	// The key endpoint is public.
	code, body = get(t, srv, walletapi.PathKey, nil)
	if code != 200 || !strings.Contains(string(body), page.Gateway) {
		t.Errorf("key: %d %s", code, body)
	}
}

// A wallet pinned to one gateway refuses statements from another.
func TestWalletPinsGateway(t *testing.T) {
	_, srv1 := serveWallets(t)
	_, srv2 := serveWallets(t) // another gateway key, same workers
	id := wallet.NewIdentity(workerKey(1))
	w, err := wallet.Open(filepath.Join(t.TempDir(), "w.db"), id, wallet.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Sync(context.Background(), srv1.Client(), srv1.URL, id.Key); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Sync(context.Background(), srv2.Client(), srv2.URL, id.Key); !errors.Is(err, wallet.ErrGatewayKey) {
		t.Fatalf("other gateway: %v, want ErrGatewayKey", err)
	}
}

// TestWalletAfterGatewayRestore: the gateway's wallets store is restored
// from an older backup (docs/operating.md allows wallets older than the
// ledger): it credits the ledger rows after its cursor again under
// statement numbers the worker's wallet already holds, with other
// contents. The wallet, which refused them for good before ("cumulative
// totals do not follow"), sees that the gateway no longer holds its last
// statement, takes the gateway's current chain from the first statement
// that differs, says so (Summary.Reissued), and syncs on normally after.
func TestWalletAfterGatewayRestore(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	l, err := ledger.Open(filepath.Join(dir, "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	wp := filepath.Join(dir, "wallets.db")
	open := func() (*Service, *httptest.Server) {
		s, err := Open(Config{Path: wp, Source: l, RateNKVRPerByte: 7})
		if err != nil {
			t.Fatal(err)
		}
		return s, httptest.NewTLSServer(s.Handler(HandlerOptions{}))
	}
	appendCredit := func(s *Service, b uint64) {
		if err := l.Append(ledger.Entry{SessionID: "s", WorkerID: workerID(1), BytesIn: b}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Credit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	s, srv := open()
	appendCredit(s, 100) // statement 1
	srv.Close()
	s.Close()
	backup, err := os.ReadFile(wp)
	if err != nil {
		t.Fatal(err)
	}
	s, srv = open()
	appendCredit(s, 200) // 2
	appendCredit(s, 300) // 3
	id := wallet.NewIdentity(workerKey(1))
	w, err := wallet.Open(filepath.Join(dir, "w.db"), id, wallet.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if n, err := w.Sync(ctx, srv.Client(), srv.URL, id.Key); err != nil || n != 3 {
		t.Fatalf("first sync: %d, %v", n, err)
	}
	srv.Close()
	s.Close()
	for _, suffix := range []string{"-wal", "-shm"} {
		os.Remove(wp + suffix)
	}
	if err := os.WriteFile(wp, backup, 0o600); err != nil {
		t.Fatal(err)
	}
	s, srv = open() // restored: cursor at row 1, statement 1
	defer func() { srv.Close(); s.Close() }()
	if _, err := s.Credit(ctx); err != nil { // rows 2 and 3 again: one statement 2, 500 bytes
		t.Fatal(err)
	}
	if _, err := w.Sync(ctx, srv.Client(), srv.URL, id.Key); err != nil {
		t.Fatalf("sync after the restore: %v", err)
	}
	sum, err := w.Summary()
	if err != nil {
		t.Fatal(err)
	}
	if sum.Statements != 2 || sum.CreditedBytes != 600 || sum.CreditedNKVR != 4200 || sum.Reissued == nil || sum.Reissued.From != 2 || sum.Reissued.Had != 3 {
		t.Fatalf("after the restore: %+v (reissued %+v)", sum, sum.Reissued)
	}
	var text strings.Builder
	if err := wallet.WriteText(&text, sum); err != nil || !strings.Contains(text.String(), "Reissued") {
		t.Fatalf("text: %v\n%s", err, text.String())
	}
	appendCredit(s, 50) // 3, on the gateway's current chain
	if n, err := w.Sync(ctx, srv.Client(), srv.URL, id.Key); err != nil || n != 1 {
		t.Fatalf("sync after: %d, %v", n, err)
	}
	if sum, _ := w.Summary(); sum.Statements != 3 || sum.CreditedBytes != 650 {
		t.Fatalf("then: %+v", sum)
	}
}
