package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/demo"
	"github.com/kvasir-ai/kvasir/engine/demomodel"
)

// metricValue returns the value of the metric line that starts with name
// (e.g. `kvasir_swarm_expert_outputs_total{where="local"}`) in a /metrics
// text, or -1 when there is none.
func metricValue(metrics, name string) float64 {
	for _, l := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// metricSum sums every series of metric name (any labels) in a /metrics
// text.
func metricSum(metrics, name string) float64 {
	sum := 0.0
	for _, l := range strings.Split(metrics, "\n") {
		if rest, ok := strings.CutPrefix(l, name+"{"); ok {
			if i := strings.LastIndexByte(rest, ' '); i >= 0 {
				if f, err := strconv.ParseFloat(rest[i+1:], 64); err == nil {
					sum += f
				}
			}
		}
	}
	return sum
}

// TestServeSwarmWorkerProcess: `backbone serve --dispatch-listen` with no
// --model-id, hub and TLS gateway, and one `backbone worker` process, all
// separate processes. The worker serves a slice cut by `backbone slice`
// ("slice"), or starts with an empty --slice folder and a --quota and
// downloads every expert from serve --provision ("provision"). The worker
// is accepted (it announces the slice model id, which serve must use, and
// holds all layers x experts with hashes equal to the backbone's), a
// streamed greedy completion over HTTP equals a local decode, and every
// expert output of it was computed by the worker: exactly rows x layers x
// k, none locally. SIGINT then stops serve with exit status 0.
func TestServeSwarmWorkerProcess(t *testing.T) {
	t.Run("slice", func(t *testing.T) { testServeSwarmWorkerProcess(t, false) })
	t.Run("provision", func(t *testing.T) { testServeSwarmWorkerProcess(t, true) })
}

func testServeSwarmWorkerProcess(t *testing.T, provision bool) {
	log := newTestLog(t)
	dir := t.TempDir()
	data, err := demomodel.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	modelPath := filepath.Join(dir, "tiny.gguf")
	if err := os.WriteFile(modelPath, data, 0o644); err != nil {
		t.Fatal(err)
	}
	sliceDir := filepath.Join(dir, "slice")
	args := []string{"serve", "--model", modelPath, "--http", "127.0.0.1:0", "--dispatch-listen", "127.0.0.1:0",
		"--wait-workers", "1", "--wait-timeout", "60s", "--threads", "1",
		"--min-deadline", "3s"} // on a loaded machine, slow answers stay remote
	workerArgs := []string{"--threads", "1"}
	if provision {
		args = append(args, "--provision", "--provision-rate", "64MiB")
		workerArgs = append(workerArgs, "--quota", strconv.Itoa(len(data))) // more than all the experts
	} else {
		runBackbone(t, 60*time.Second, "slice", "--model", modelPath, "--layers", "0,1,2,3", "--out", sliceDir)
	}

	srv, err := demo.Start("serve", log, []string{asBackbone}, backboneBin(t), args...)
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
	sw := startTestSwarm(t, m[1], log)
	if _, err := sw.AddWorker("worker-0", sliceDir, workerArgs...); err != nil {
		t.Fatal(err)
	}
	h, err := srv.Await(ctx, regexp.MustCompile(`msg=serving http=(\S+)`))
	if err != nil {
		t.Fatal(err)
	}
	addr := h[1]
	lm, err := loadGenModel(modelPath)
	if err != nil {
		t.Fatal(err)
	}
	defer lm.Close()
	p := lm.m.Params()
	// Every expert held (a provisioned worker downloads them first).
	for held := 0.0; held != float64(p.Layers*p.Experts); {
		met := getMetrics(t, addr)
		held = metricSum(met, "kvasir_swarm_worker_holdings")
		if ctx.Err() != nil {
			t.Fatalf("worker holds %v experts, want %d\n%s", held, p.Layers*p.Experts, grepLines(met, "kvasir_swarm_"))
		}
		time.Sleep(20 * time.Millisecond)
	}

	const prompt, n = "Workers announce the slice id", 12
	got, code := streamCompletion(t, addr, prompt, n)
	if code != 200 {
		t.Fatalf("%d %s", code, got)
	}
	if want := localGreedyText(t, prompt, n); got != want {
		t.Errorf("swarm %q, local decode %q", got, want)
	}
	local, err := decode(context.Background(), lm, decodeOptions{prompt: prompt, maxTokens: n}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	rows := len(local.PromptTokens) + len(local.Tokens) - 1 // rows through each layer
	met := getMetrics(t, addr)
	remote := metricValue(met, `kvasir_swarm_expert_outputs_total{where="remote"}`)
	localN := metricValue(met, `kvasir_swarm_expert_outputs_total{where="local"}`)
	if want := float64(rows * p.Layers * p.ExpertsUsed); remote != want || localN != 0 {
		t.Errorf("expert outputs remote %v local %v, want %v and 0\n%s", remote, localN, want, grepLines(met, "kvasir_swarm_"))
	}

	if err := srv.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-srv.Done():
		if err := srv.Err(); err != nil {
			t.Errorf("serve after SIGINT: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("serve did not stop on SIGINT")
	}
}
