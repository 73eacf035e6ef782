package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/demo"
	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/backbone/run"
	"github.com/kvasir-ai/kvasir/engine/demomodel"
)

// writeFullAndBackbone writes the embedded tiny model and its
// backbone-only file (hot: --hot-layers/--hot-experts arguments, if any)
// with the slice command, returning both paths.
func writeFullAndBackbone(t *testing.T, hot ...string) (full, bo string) {
	t.Helper()
	data, err := demomodel.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	full, bo = filepath.Join(dir, "full.gguf"), filepath.Join(dir, "backbone.gguf")
	if err := os.WriteFile(full, data, 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	args := append([]string{"--model", full, "--backbone-only", "--out", bo, "--source-url", "http://127.0.0.1:1/full.gguf"}, hot...)
	if code := sliceMain(args, &out, &errb); code != 0 {
		t.Fatalf("slice --backbone-only: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "backbone-only file of") {
		t.Fatalf("output %q", out.String())
	}
	return full, bo
}

// TestSliceBackboneOnlyCommand: the command writes a file the backbone
// loads with the full model's id and only the hot experts; such a file
// refuses to decode (generate, serve) without workers; bad flags are
// usage errors.
func TestSliceBackboneOnlyCommand(t *testing.T) {
	full, bo := writeFullAndBackbone(t, "--hot-layers", "1", "--hot-experts", "2,5")
	fm, err := run.Load(full)
	if err != nil {
		t.Fatal(err)
	}
	defer fm.Close()
	bm, err := run.Load(bo)
	if err != nil {
		t.Fatal(err)
	}
	defer bm.Close()
	if bm.ID() != fm.ID() || bm.BackboneOnly() == nil || fm.BackboneOnly() != nil {
		t.Fatalf("ids %q / %q", bm.ID(), fm.ID())
	}
	if h := bm.BackboneOnly().Hot; len(h) != 2 || h[0] != [2]int{1, 2} || h[1] != [2]int{1, 5} {
		t.Fatalf("hot %v", h)
	}
	if err := bm.CheckLocal(); !errors.Is(err, run.ErrNeedsSwarm) {
		t.Fatalf("CheckLocal: %v", err)
	}
	var out, errb bytes.Buffer
	if code := generateMain([]string{"--model", bo, "--max-tokens", "2"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "backbone-only") {
		t.Fatalf("generate on a backbone-only file alone: exit %d: %s", code, errb.String())
	}
	errb.Reset()
	if code := serveMain(context.Background(), []string{"--model", bo, "--http", "127.0.0.1:0"}, &errb, nil); code != 1 ||
		!strings.Contains(errb.String(), "--dispatch-listen") {
		t.Fatalf("serve on a backbone-only file alone: exit %d: %s", code, errb.String())
	}
	for _, args := range [][]string{
		{"--model", full, "--backbone-only"},                                         // no --out
		{"--model", full, "--backbone-only", "--out", bo, "--hot-layers", "0"},       // layers without experts
		{"--model", full, "--backbone-only", "--out", bo, "--layers", "0"},           // --layers is for slices
		{"--model", full, "--backbone-only", "--out", bo, "--source-url", "ftp://x"}, // not http(s)
		{"--model", full, "--backbone-only", "--out", bo, "--hot-layers", "9", "--hot-experts", "0"},
	} {
		errb.Reset()
		if code := sliceMain(args, io.Discard, &errb); code != 2 {
			t.Errorf("%v: exit %d (%s), want 2", args, code, errb.String())
		}
	}
	errb.Reset()
	if code := sliceMain([]string{"--model", bo, "--backbone-only", "--out", bo + "2"}, io.Discard, &errb); code != 1 ||
		!strings.Contains(errb.String(), "already a backbone-only") {
		t.Errorf("re-slicing: exit %d: %s", code, errb.String())
	}
}

// TestBackboneOnlyGenerateProcesses: `generate` on the backbone-only file
// with two worker processes serving slices of the full model (even and odd
// layers) decodes the full model's tokens and logits bit for bit, every
// expert remote.
func TestBackboneOnlyGenerateProcesses(t *testing.T) {
	full, bo := writeFullAndBackbone(t)
	log := newTestLog(t)
	dir := t.TempDir()
	s0, s1 := filepath.Join(dir, "even"), filepath.Join(dir, "odd")
	runBackbone(t, 60*time.Second, "slice", "--model", full, "--layers", "0,2", "--out", s0)
	runBackbone(t, 60*time.Second, "slice", "--model", full, "--layers", "1,3", "--out", s1)
	const n = 12
	args := []string{"--prompt", "All experts elsewhere", "--max-tokens", fmt.Sprint(n), "--temperature", "0", "--json", "--threads", "1"}
	var local generateResult
	if err := json.Unmarshal(runBackbone(t, 60*time.Second, append([]string{"generate", "--model", full}, args...)...), &local); err != nil {
		t.Fatal(err)
	}
	gen, err := demo.Start("generate", log, []string{asBackbone}, backboneBin(t),
		append(append([]string{"generate", "--model", bo}, args...), "--dispatch-listen", "127.0.0.1:0", "--wait-workers", "2",
			"--wait-timeout", "60s", "--min-deadline", "3s", "--holder-wait", "30s")...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gen.Stop(5 * time.Second) })
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	m, err := gen.Await(ctx, regexp.MustCompile(`^generate: dispatch listening on (\S+) `))
	if err != nil {
		t.Fatal(err)
	}
	sw := startTestSwarm(t, m[1], log)
	for i, s := range []string{s0, s1} {
		if _, err := sw.AddWorker(fmt.Sprintf("worker-%d", i), s, "--threads", "1"); err != nil {
			t.Fatal(err)
		}
	}
	line, err := gen.Await(ctx, jsonLine)
	if err != nil {
		t.Fatal(err)
	}
	<-gen.Done()
	if err := gen.Err(); err != nil {
		t.Fatalf("generate: %v", err)
	}
	var swarm generateResult
	if err := json.Unmarshal([]byte(line[0]), &swarm); err != nil {
		t.Fatal(err)
	}
	if len(local.Tokens) == 0 || !slices.Equal(swarm.Tokens, local.Tokens) || swarm.LogitsSHA256 != local.LogitsSHA256 {
		t.Errorf("backbone-only swarm tokens %v (logits %s), full local %v (logits %s)", swarm.Tokens, swarm.LogitsSHA256,
			local.Tokens, local.LogitsSHA256)
	}
	if swarm.ExpertsLocal == nil || *swarm.ExpertsLocal != 0 || swarm.ExpertsRemote == nil || *swarm.ExpertsRemote == 0 {
		t.Errorf("experts local %v remote %v", swarm.ExpertsLocal, swarm.ExpertsRemote)
	}
}

// TestBackboneOnlyLastHolderKilled: a decode on the backbone-only file whose
// only holder of the odd layers is SIGKILLed mid-decode fails with
// ErrNoHolder after the holder wait; every token it produced before is the
// full model's.
func TestBackboneOnlyLastHolderKilled(t *testing.T) {
	full, bo := writeFullAndBackbone(t)
	log := newTestLog(t)
	fm, err := loadGenModel(full)
	if err != nil {
		t.Fatal(err)
	}
	defer fm.Close()
	fm.m.SetThreads(1)
	opts := decodeOptions{prompt: "The last holder leaves", maxTokens: 64}
	local, err := decode(context.Background(), fm, opts, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	lm, err := loadGenModel(bo)
	if err != nil {
		t.Fatal(err)
	}
	defer lm.Close()
	lm.m.SetThreads(1)
	const wait = 700 * time.Millisecond
	d, err := run.StartSwarm(context.Background(), lm.Model, run.SwarmConfig{Listen: "127.0.0.1:0", Logger: quietLogger(),
		HolderWait: wait, Tune: func(c *dispatch.Config) { c.MaxDeadline = 2 * time.Second }})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	sw := startTestSwarm(t, d.Addr(), log)
	dir := t.TempDir()
	var odd *demo.Proc
	for i, layers := range []string{"0,2", "1,3"} {
		s := filepath.Join(dir, strconv.Itoa(i))
		runBackbone(t, 60*time.Second, "slice", "--model", full, "--layers", layers, "--out", s)
		w, err := sw.AddWorker(fmt.Sprintf("worker-%d", i), s, "--threads", "1")
		if err != nil {
			t.Fatal(err)
		}
		odd = w
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := d.WaitWorkers(ctx, 2); err != nil {
		t.Fatal(err)
	}
	lm.m.SetExperts(d)
	var got []int32
	opts.onToken = func(i int, tok int32) {
		got = append(got, tok)
		if i == 4 {
			odd.Kill()
		}
	}
	start := time.Now()
	_, err = decode(ctx, lm, opts, io.Discard)
	var me *dispatch.MissingError
	if !errors.Is(err, dispatch.ErrNoHolder) || !errors.As(err, &me) || me.Layer%2 != 1 {
		t.Fatalf("after the last holder of the odd layers died: %v (after %v)", err, time.Since(start))
	}
	if len(got) < 5 || !slices.Equal(got, local.Tokens[:len(got)]) {
		t.Fatalf("tokens before the failure %v, full model's %v", got, local.Tokens[:len(got)])
	}
	if st := d.Stats(); st.ExpertsLocal != 0 || st.NoHolderFailures != 1 {
		t.Fatalf("local %d, no-holder failures %d", st.ExpertsLocal, st.NoHolderFailures)
	}
	t.Logf("%d tokens identical, then: %v", len(got), err)
}

// TestServeBackboneOnlyNoHolder: serving a backbone-only file with no
// worker: /v1/models reports every expert missing, a completion (plain or
// streamed) answers 503 with Retry-After and the missing count, and the
// metrics carry the coverage.
func TestServeBackboneOnlyNoHolder(t *testing.T) {
	_, bo := writeFullAndBackbone(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan string, 1)
	done := make(chan int, 1)
	go func() {
		done <- serveMain(ctx, []string{"--model", bo, "--http", "127.0.0.1:0", "--dispatch-listen", "127.0.0.1:0",
			"--holder-wait", "300ms", "--threads", "1"}, io.Discard, func(a string) { ready <- a })
	}()
	var addr string
	select {
	case addr = <-ready:
	case code := <-done:
		t.Fatalf("serve exited %d", code)
	}
	get := func(path string) []byte {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return b
	}
	var models struct {
		Data []struct {
			Coverage dispatch.Coverage `json:"kvasir_coverage"`
		} `json:"data"`
	}
	if err := json.Unmarshal(get("/v1/models"), &models); err != nil || len(models.Data) != 1 {
		t.Fatal(err)
	}
	lm, _ := run.Load(bo)
	p := lm.Engine().Params()
	lm.Close()
	all := p.ExpertLayers * p.Experts
	if cv := models.Data[0].Coverage; cv.Experts != all || cv.Missing != all || cv.Local != 0 || cv.MinReplicas != 0 {
		t.Fatalf("coverage %+v", cv)
	}
	for _, stream := range []bool{false, true} {
		body := fmt.Sprintf(`{"prompt":"hi","max_tokens":3,"stream":%v}`, stream)
		resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" ||
			resp.Header.Get("X-Kvasir-Missing-Experts") != strconv.Itoa(all) || !strings.Contains(string(b), "no_expert_holder") {
			t.Fatalf("stream %v: %d Retry-After %q missing %q: %s", stream, resp.StatusCode, resp.Header.Get("Retry-After"),
				resp.Header.Get("X-Kvasir-Missing-Experts"), b)
		}
	}
	metrics := string(get("/metrics"))
	for _, want := range []string{fmt.Sprintf(`kvasir_swarm_experts{state="missing"} %d`, all), "kvasir_swarm_no_holder_failures_total 2",
		fmt.Sprintf(`kvasir_swarm_expert_replicas{replicas="0"} %d`, all), "kvasir_swarm_expert_min_replicas 0"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	cancel()
	<-done
}

// TestDemoCapacity: `demo --capacity`: the backbone holds no routed expert,
// the workers download theirs from a loopback HTTP source (two copies of
// each), and the decode equals the full model's local decode bit for bit.
func TestDemoCapacity(t *testing.T) {
	const prompt, n = "Capacity from the swarm", 16
	out := runBackbone(t, 180*time.Second, "demo", "--json", "--capacity", "--max-tokens", strconv.Itoa(n),
		"--prompt", prompt, "--min-deadline", "3s")
	var r demo.Result
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	lm, err := loadGenModel("")
	if err != nil {
		t.Fatal(err)
	}
	defer lm.Close()
	local, err := decode(context.Background(), lm, decodeOptions{prompt: prompt, maxTokens: n}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !r.TokensEqual || !r.LogitsEqual || !slices.Equal(r.Tokens, local.Tokens) || r.ExpertsLocal != 0 || r.ExpertsRemote == 0 {
		t.Fatalf("tokens %v (equal %v, logits %v), local %v; experts local %d remote %d", r.Tokens, r.TokensEqual,
			r.LogitsEqual, local.Tokens, r.ExpertsLocal, r.ExpertsRemote)
	}
	c := r.Capacity
	p := lm.m.Params()
	all := p.ExpertLayers * p.Experts
	if c == nil || c.LocalExperts != 0 || c.SourceRequests < int64(2*all) || c.SourceBytes < 2*c.ExpertBytes ||
		c.Coverage.Missing != 0 || c.Coverage.MinReplicas != 2 || c.CrossChecks == 0 {
		t.Fatalf("capacity %+v", c)
	}
	if c.BackboneBytes > c.FullBytes-c.ExpertBytes+64<<10 {
		t.Errorf("backbone-only file %d bytes, full %d, experts %d", c.BackboneBytes, c.FullBytes, c.ExpertBytes)
	}
}
