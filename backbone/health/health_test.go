package health

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
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
