package credit

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/health"
	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/backbone/pgstore/pgtest"
)

// TestCreditingReadiness: the gateway's /readyz as `backbone gateway
// --wallets` mounts it (the hub dial aside): ready while the wallets store
// and the hub's ledger answer; 503 naming the ledger when the signature is
// wrong (401) or the hub is down (connection refused); 503 naming the
// wallets store when it is closed (SQLite) or unreachable (PostgreSQL
// behind a proxy that stops, skipped without a server).
func TestCreditingReadiness(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) {
		testCreditingReadiness(t, filepath.Join(t.TempDir(), "wallets.sqlite"), nil)
	})
	t.Run("postgres", func(t *testing.T) {
		dsn := pgtest.DSN(t)
		proxy, pdsn := pgtest.NewProxy(t, dsn)
		testCreditingReadiness(t, pdsn, proxy.Close)
	})
}

// testCreditingReadiness runs the readiness sequence over the wallets
// store at path; cut, when set, makes that store unreachable (else Stop
// closes it).
func testCreditingReadiness(t *testing.T, path string, cut func()) {
	l, err := ledger.Open(filepath.Join(t.TempDir(), "ledger.sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const secret = "s3cret"
	hubLedger := httptest.NewServer(ledger.Handler(l, func(r *http.Request) bool { return r.Header.Get("X-Test-Secret") == secret }))
	defer hubLedger.Close()
	var sent atomic.Value
	sent.Store(secret)
	cr, err := StartFromHub(context.Background(), HubConfig{Wallets: path, Hub: hubLedger.URL, Every: time.Hour, Logf: t.Logf,
		Sign: func(r *http.Request) error { r.Header.Set("X-Test-Secret", sent.Load().(string)); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer cr.Stop()
	mux := http.NewServeMux()
	health.Mount(mux, cr.Checks...)
	readyz := func() (int, health.Report) {
		t.Helper()
		rec := httptest.NewRecorder()
		start := time.Now()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, health.ReadyzPath, nil))
		if el := time.Since(start); el > health.Timeout+time.Second {
			t.Errorf("/readyz took %v (checks are bounded by %v)", el, health.Timeout)
		}
		var r health.Report
		if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil {
			t.Fatalf("%v: %s", err, rec.Body)
		}
		return rec.Code, r
	}
	if code, r := readyz(); code != 200 || !r.Ready || r.Checks["wallets"] != "ok" || r.Checks["ledger"] != "ok" || r.Checks["crediting"] != "ok" || len(r.Checks) != 3 {
		t.Fatalf("ready: %d %+v", code, r)
	}

	sent.Store("wrong")
	if code, r := readyz(); code != 503 || r.Checks["wallets"] != "ok" || !strings.Contains(r.Checks["ledger"], "401") {
		t.Fatalf("wrong secret: %d %+v", code, r)
	}
	sent.Store(secret)
	hubLedger.Close()
	if code, r := readyz(); code != 503 || r.Checks["wallets"] != "ok" || !strings.Contains(r.Checks["ledger"], "connection refused") {
		t.Fatalf("hub down: %d %+v", code, r)
	}

	if cut != nil {
		cut()
	} else {
		cr.Stop()
	}
	code, r := readyz()
	if code != 503 || r.Ready || !strings.HasPrefix(r.Checks["wallets"], "wallets store (") || r.Checks["wallets"] == "ok" {
		t.Fatalf("wallets store gone: %d %+v", code, r)
	}
	if cut == nil && !strings.Contains(r.Checks["wallets"], "database is closed") {
		t.Errorf("closed SQLite store: %q", r.Checks["wallets"])
	}
	t.Logf("wallets store gone: %q", r.Checks["wallets"])
}
