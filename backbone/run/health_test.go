package run

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
)

// /healthz and /readyz sit in front of the API: ready needs the coverage
// the options ask and ends with the serving context; other paths reach the API.
func TestWithHealth(t *testing.T) {
	cv := dispatch.Coverage{Experts: 4, Covered: 3, Missing: 1, ByReplicas: []int{1, 2, 1}}
	ex := &APIExperts{Coverage: func() dispatch.Coverage { return cv }}
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	ctx, cancel := context.WithCancel(context.Background())
	h := withHealth(ctx, api, ex, 2)
	get := func(p string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, p, nil))
		return rec.Code, rec.Body.String()
	}
	if c, _ := get("/healthz"); c != 200 {
		t.Fatalf("healthz %d", c)
	}
	if c, b := get("/readyz"); c != 503 || !strings.Contains(b, "held by no worker") {
		t.Fatalf("missing expert: %d %s", c, b)
	}
	cv = dispatch.Coverage{Experts: 4, Covered: 4, ByReplicas: []int{0, 1, 3}}
	if c, b := get("/readyz"); c != 503 || !strings.Contains(b, "fewer than 2 workers") {
		t.Fatalf("one holder: %d %s", c, b)
	}
	cv = dispatch.Coverage{Experts: 4, Covered: 4, ByReplicas: []int{0, 0, 4}}
	if c, b := get("/readyz"); c != 200 {
		t.Fatalf("covered: %d %s", c, b)
	}
	if c, _ := get("/v1/models"); c != http.StatusTeapot {
		t.Fatalf("API path %d", c)
	}
	cancel()
	if c, b := get("/readyz"); c != 503 || !strings.Contains(b, "shutting down") {
		t.Fatalf("draining: %d %s", c, b)
	}
}
