package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/demo"
)

// TestServeLayerHolders: `backbone serve --dispatch-listen --ready-holders
// 1`, hub and TLS gateway, and four `backbone worker --model-tiny` processes
// holding layers {0,1,2}, {1,2}, {2} and {3}, all separate processes. The
// kvasir_swarm_layer_holders gauges equal the workers started per layer
// (1, 2, 3, 1) and every expert is held, so /readyz answers 200; SIGKILL
// of the second worker drops layers 1 and 2 by one (1, 1, 2, 1; still
// ready); SIGKILL of the first leaves layers 0 and 1 with no holder
// (0, 0, 1, 1): /readyz answers 503 naming those two layers, from the
// same numbers.
func TestServeLayerHolders(t *testing.T) {
	log := newTestLog(t)
	// serve's default model is the embedded one that --model-tiny workers hold.
	srv, err := demo.Start("serve", log, []string{asBackbone}, backboneBin(t), "serve",
		"--http", "127.0.0.1:0", "--dispatch-listen", "127.0.0.1:0", "--ready-holders", "1", "--threads", "1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop(5 * time.Second) })
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	m, err := srv.Await(ctx, regexp.MustCompile(`^serve: dispatch listening on (\S+) `))
	if err != nil {
		t.Fatal(err)
	}
	h, err := srv.Await(ctx, regexp.MustCompile(`msg=serving http=(\S+)`))
	if err != nil {
		t.Fatal(err)
	}
	addr := h[1]
	lm, err := loadGenModel("") // the embedded model
	if err != nil {
		t.Fatal(err)
	}
	p := lm.m.Params()
	lm.Close()
	if p.ExpertLayers != 4 {
		t.Fatalf("the embedded model has %d expert layers; this test's holdings assume 4", p.ExpertLayers)
	}

	sw := startTestSwarm(t, m[1], log)
	var procs []*demo.Proc
	for i, layers := range []string{"0,1,2", "1,2", "2", "3"} {
		w, err := sw.AddWorker(fmt.Sprintf("worker-%d", i), "", "--model-tiny", "--layers", layers, "--threads", "1")
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, w)
	}

	// gauges reads the four per-layer series of one scrape.
	type layerRow struct{ holders, held, missing, min [4]float64 }
	gauges := func() (layerRow, string) {
		met := getMetrics(t, addr)
		var r layerRow
		for l := range 4 {
			lab := fmt.Sprintf(`{layer="%d"}`, l)
			r.holders[l] = metricValue(met, "kvasir_swarm_layer_holders"+lab)
			r.held[l] = metricValue(met, "kvasir_swarm_layer_experts_held"+lab)
			r.missing[l] = metricValue(met, "kvasir_swarm_layer_experts_missing"+lab)
			r.min[l] = metricValue(met, "kvasir_swarm_layer_min_holders"+lab)
		}
		return r, grepLines(met, "kvasir_swarm_layer_")
	}
	all := float64(p.Experts)
	expect := func(what string, holders [4]float64) {
		t.Helper()
		want := layerRow{holders: holders, missing: [4]float64{}, min: holders}
		for l, n := range holders {
			if n > 0 {
				want.held[l] = all // every worker holds every expert of its layers
			}
		}
		got, lines := gauges()
		for got != want {
			if ctx.Err() != nil {
				t.Fatalf("%s: gauges %+v, want %+v\n%s", what, got, want, lines)
			}
			time.Sleep(50 * time.Millisecond)
			got, lines = gauges()
		}
	}
	readyz := func() (int, string) {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	expect("four workers", [4]float64{1, 2, 3, 1})
	if code, body := readyz(); code != 200 {
		t.Fatalf("/readyz with every layer held: %d %s", code, body)
	}

	procs[1].Kill()
	expect("worker 1 killed", [4]float64{1, 1, 2, 1})
	if code, body := readyz(); code != 200 {
		t.Fatalf("/readyz with every layer still held: %d %s", code, body)
	}

	procs[0].Kill()
	expect("workers 0 and 1 killed", [4]float64{0, 0, 1, 1})
	code, body := readyz()
	if want := "experts held by fewer than the 1 workers --ready-holders asks in 2 of 4 layers: 0 (fewest 0, 0 workers in the layer), 1 (fewest 0, 0 workers in the layer)"; code != 503 || !strings.Contains(body, want) {
		t.Fatalf("/readyz with layers 0 and 1 unheld: %d %s, want 503 with %q", code, body, want)
	}
}
