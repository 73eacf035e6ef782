package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/demo"
)

// TestCapacityRSS measures what issue 12 promises for a large model: the
// backbone's memory serving it from a backbone-only file, every expert on
// a worker, beside the same decode with the full file local, and that both
// decodes compute the same logits. It runs only with
// KVASIR_BENCH_CAPACITY=FULL.gguf (e.g. the 48-layer Qwen3-30B-A3B-shape
// Q4_K model of `backbone genmodel --preset qwen3-30b-a3b`, 16.9 GB; it
// needs about that much free memory for the page cache) and
// KVASIR_BENCH_TOKENS (default 16):
//
//	KVASIR_BENCH_CAPACITY=$HOME/.cache/kvasir-bench/qwen3-30b-a3b-48L-Q4_K-s1.gguf \
//	    go test ./backbone -run TestCapacityRSS -v -timeout 60m
//
// Processes: `slice --backbone-only`; `generate` on the full file (local
// experts); hub, TLS gateway, one worker serving the full file's experts
// (`worker --slice FULL.gguf`) and `generate` on the backbone-only file.
// Each generate reports its VmRSS and VmHWM (generateResult).
func TestCapacityRSS(t *testing.T) {
	full := os.Getenv("KVASIR_BENCH_CAPACITY")
	if full == "" {
		t.Skip("KVASIR_BENCH_CAPACITY=FULL.gguf not set")
	}
	n := 16
	if s := os.Getenv("KVASIR_BENCH_TOKENS"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	log := newTestLog(t)
	dir := t.TempDir()
	bo := filepath.Join(dir, "backbone.gguf")
	start := time.Now()
	t.Logf("%s", runBackbone(t, 30*time.Minute, "slice", "--model", full, "--backbone-only", "--out", bo))
	t.Logf("slice --backbone-only took %v", time.Since(start).Round(time.Millisecond))
	fst, _ := os.Stat(full)
	bst, _ := os.Stat(bo)
	args := []string{"--prompt", "The swarm holds the experts", "--max-tokens", strconv.Itoa(n), "--temperature", "0", "--json"}

	gen, err := demo.Start("generate", log, []string{asBackbone}, backboneBin(t),
		append(append([]string{"generate", "--model", bo}, args...), "--dispatch-listen", "127.0.0.1:0", "--wait-workers", "1",
			"--wait-timeout", "30m", "--min-deadline", "10s", "--holder-wait", "5m")...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gen.Stop(5 * time.Second) })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Minute)
	defer cancel()
	m, err := gen.Await(ctx, regexp.MustCompile(`^generate: dispatch listening on (\S+) `))
	if err != nil {
		t.Fatal(err)
	}
	sw := startTestSwarm(t, m[1], log)
	if _, err := sw.AddWorker("worker-all", full, "--threads", "2"); err != nil {
		t.Fatal(err)
	}
	line, err := gen.Await(ctx, jsonLine)
	if err != nil {
		t.Fatal(err)
	}
	<-gen.Done()
	var swarm generateResult
	if err := json.Unmarshal([]byte(line[0]), &swarm); err != nil {
		t.Fatal(err)
	}
	sw.Close()

	var local generateResult
	if err := json.Unmarshal(runBackbone(t, 30*time.Minute, append([]string{"generate", "--model", full}, args...)...), &local); err != nil {
		t.Fatal(err)
	}
	gb := func(b int64) float64 { return float64(b) / 1e9 }
	t.Logf("files: full %d bytes (%.2f GB), backbone-only %d bytes (%.3f GB)", fst.Size(), gb(fst.Size()), bst.Size(), gb(bst.Size()))
	t.Logf("local decode on the full file:      RSS %.3f GB, peak %.3f GB, decode %.2f tok/s, logits %s",
		gb(local.RSSBytes), gb(local.PeakRSSBytes), local.DecodeTokS, local.LogitsSHA256)
	t.Logf("backbone-only, every expert remote: RSS %.3f GB, peak %.3f GB, decode %.2f tok/s, logits %s (experts remote %v, local %v)",
		gb(swarm.RSSBytes), gb(swarm.PeakRSSBytes), swarm.DecodeTokS, swarm.LogitsSHA256, *swarm.ExpertsRemote, *swarm.ExpertsLocal)
	if swarm.LogitsSHA256 != local.LogitsSHA256 || *swarm.ExpertsLocal != 0 {
		t.Errorf("the backbone-only swarm decode differs from the full local decode")
	}
}
