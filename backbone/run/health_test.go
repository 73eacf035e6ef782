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
// the options ask (read per layer, as the kvasir_swarm_layer_* gauges
// export it) and ends with the serving context; other paths reach the API.
func TestWithHealth(t *testing.T) {
	cv := dispatch.Coverage{Experts: 4, Covered: 3, Missing: 1, ByReplicas: []int{1, 2, 1},
		Layers: []dispatch.LayerCoverage{{Holders: 2, Held: 2, MinHolders: 1}, {Holders: 1, Held: 1, Missing: 1}}}
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
	if c, b := get("/readyz"); c != 503 || !strings.Contains(b, "1 of 4 experts held by no worker and not computed here; layers (missing): 1 (1)") {
		t.Fatalf("missing expert: %d %s", c, b)
	}
	cv = dispatch.Coverage{Experts: 4, Covered: 4, ByReplicas: []int{0, 1, 3},
		Layers: []dispatch.LayerCoverage{{Holders: 3, Held: 2, MinHolders: 2}, {Holders: 2, Held: 2, MinHolders: 1}}}
	if c, b := get("/readyz"); c != 503 || !strings.Contains(b, "fewer than the 2 workers --ready-holders asks in 1 of 2 layers: 1 (fewest 1, 2 workers in the layer)") {
		t.Fatalf("one holder: %d %s", c, b)
	}
	cv = dispatch.Coverage{Experts: 4, Covered: 4, ByReplicas: []int{0, 0, 4},
		Layers: []dispatch.LayerCoverage{{Holders: 2, Held: 2, MinHolders: 2}, {Holders: 3, Held: 2, MinHolders: 2}}}
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
