package health

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func get(t *testing.T, mux *http.ServeMux, path string) (int, Report) {
	t.Helper()
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	var r Report
	if path == ReadyzPath {
		if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil {
			t.Fatalf("%s: %v: %s", path, err, rec.Body)
		}
	}
	return rec.Code, r
}

func TestHealthzAndReadyz(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ready := false
	mux := http.NewServeMux()
	Mount(mux, Dial("peer", ln.Addr().String()), Check{Name: "loaded", Fn: func(context.Context) error {
		if !ready {
			return errors.New("not yet")
		}
		return nil
	}})
	if code, _ := get(t, mux, HealthzPath); code != 200 {
		t.Fatalf("healthz %d", code)
	}
	code, r := get(t, mux, ReadyzPath)
	if code != 503 || r.Ready || r.Checks["loaded"] != "not yet" || r.Checks["peer"] != "ok" {
		t.Fatalf("not ready: %d %+v", code, r)
	}
	ready = true
	if code, r := get(t, mux, ReadyzPath); code != 200 || !r.Ready {
		t.Fatalf("ready: %d %+v", code, r)
	}
	ln.Close()
	if code, r := get(t, mux, ReadyzPath); code != 503 || r.Checks["peer"] == "ok" {
		t.Fatalf("peer down: %d %+v", code, r)
	}
}

// TestPeer: a peer's /readyz decides the check: 200 passes, a 503 fails
// with the peer's failing checks, a peer that does not listen fails with
// the dial error. (The gateway's "hub" check dialled the hub's port only,
// and said ok while the hub turned every worker away.)
func TestPeer(t *testing.T) {
	ready := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != ReadyzPath {
			http.NotFound(w, r)
			return
		}
		if ready {
			json.NewEncoder(w).Encode(Report{Ready: true, Checks: map[string]string{"backbone": "ok"}})
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		json.NewEncoder(w).Encode(Report{Checks: map[string]string{"backbone": "dial tcp 127.0.0.1:7002: connect: connection refused", "ledger": "ok"}})
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	c := Peer("hub", addr)
	if err := c.Fn(context.Background()); err != nil {
		t.Fatalf("ready peer: %v", err)
	}
	ready = false
	if err := c.Fn(context.Background()); err == nil || !strings.Contains(err.Error(), "backbone: dial tcp 127.0.0.1:7002") || strings.Contains(err.Error(), "ledger") {
		t.Fatalf("peer not ready: %v", err)
	}
	srv.Close()
	if err := c.Fn(context.Background()); err == nil {
		t.Fatal("a peer that does not listen passed")
	}
}
