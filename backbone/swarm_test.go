package main

// Swarm tests over real processes: hub, gateway and workers are this
// package's own binary run as children (see TestMain), on loopback.

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/demo"
	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/backbone/gateway"
	"github.com/kvasir-ai/kvasir/engine/worker"
)

// asBackbone is the environment variable that makes the test binary run
// the backbone command (main) instead of the tests. Running the test binary
// itself as hub, gateway, worker, generate and demo tests exactly the code
// under test without a second build (a `go build` of this package takes
// longer than all these tests on a loaded 2-core machine), and `backbone
// demo`'s own re-exec of os.Executable() then re-enters the test binary the
// same way.
const asBackbone = "KVASIR_TEST_AS_BACKBONE=1"

func TestMain(m *testing.M) {
	if os.Getenv("KVASIR_TEST_AS_BACKBONE") == "1" {
		main() // exits
	}
	os.Exit(m.Run())
}

// backboneBin returns the binary that runs as the backbone command with
// the environment asBackbone.
func backboneBin(t testing.TB) string {
	t.Helper()
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// runBackbone runs `backbone args...` as a child process and returns its
// stdout; it fails the test on a non-zero exit.
func runBackbone(t *testing.T, timeout time.Duration, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, backboneBin(t), args...)
	cmd.Env = append(os.Environ(), asBackbone)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("backbone %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// testLog collects the children's logs and prints them if the test fails.
type testLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *testLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func newTestLog(t *testing.T) *testLog {
	l := &testLog{}
	t.Cleanup(func() {
		if t.Failed() {
			l.mu.Lock()
			t.Logf("children's logs:\n%s", l.b.String())
			l.mu.Unlock()
		}
	})
	return l
}

// startTestSwarm starts hub and gateway processes bridging to backbone.
func startTestSwarm(t *testing.T, backbone string, log io.Writer) *demo.Swarm {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sw, err := demo.StartSwarm(ctx, demo.Config{Bin: backboneBin(t), Env: []string{asBackbone}, Dir: t.TempDir(),
		Backbone: backbone, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sw.Close)
	return sw
}

var jsonLine = regexp.MustCompile(`^\{.*\}$`)

// TestSwarmGenerateProcesses: a model cut into two slices (even and odd
// layers, by `backbone slice`), hub + TLS gateway + two worker processes,
// and `backbone generate --dispatch-listen` as one more process: the greedy
// tokens and every logit are bit-identical to `backbone generate` with local
// experts, every expert output was computed by a worker, and each worker
// served exactly the rows its layers saw.
func TestSwarmGenerateProcesses(t *testing.T) {
	fixtures := filepath.Join("..", "..", "shared", "fixtures")
	fixture := func(name string) func(t *testing.T) string {
		return func(t *testing.T) string {
			p := filepath.Join(fixtures, name)
			if _, err := os.Stat(p); err != nil {
				t.Skipf("fixture model absent (%v); see ../shared/fixtures/README.md", err)
			}
			return p
		}
	}
	cases := []struct {
		name, prompt string
		model        func(t *testing.T) string
	}{
		{"fixture-Q4_K_M", "The quick brown fox", fixture("tiny-qwen3moe-Q4_K_M.gguf")},
		// qwen35moe: Gated DeltaNet and gated attention on the backbone,
		// the shared expert computed while the routed experts are away.
		{"fixture-qwen35moe-Q4_K_M", "The capital of France is", fixture("qwen35moe/tiny-qwen35moe-Q4_K_M.gguf")},
		{"generated-Q4_K_M", "Workers anywhere", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "gen.gguf")
			runBackbone(t, 60*time.Second, "genmodel", "--preset", "tiny", "--type", "Q4_K_M", "--seed", "7", "--out", p)
			return p
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := c.model(t)
			log := newTestLog(t)
			dir := t.TempDir()
			s0, s1 := filepath.Join(dir, "even"), filepath.Join(dir, "odd")
			runBackbone(t, 60*time.Second, "slice", "--model", path, "--layers", "0,2", "--out", s0)
			runBackbone(t, 60*time.Second, "slice", "--model", path, "--layers", "1,3", "--out", s1)
			const n = 12
			args := []string{"generate", "--model", path, "--prompt", c.prompt, "--max-tokens", fmt.Sprint(n),
				"--temperature", "0", "--json", "--threads", "1"}
			var local generateResult
			if err := json.Unmarshal(runBackbone(t, 60*time.Second, args...), &local); err != nil {
				t.Fatal(err)
			}

			gen, err := demo.Start("generate", log, []string{asBackbone}, backboneBin(t),
				append(args, "--dispatch-listen", "127.0.0.1:0", "--wait-workers", "2", "--wait-timeout", "60s",
					"--min-deadline", "3s")...) // on a loaded machine, slow answers stay remote
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
			if len(local.Tokens) == 0 || !slices.Equal(swarm.Tokens, local.Tokens) {
				t.Errorf("swarm tokens %v, local %v", swarm.Tokens, local.Tokens)
			}
			if swarm.LogitsSHA256 != local.LogitsSHA256 {
				t.Errorf("logits differ: swarm %s, local %s", swarm.LogitsSHA256, local.LogitsSHA256)
			}
			// Every token row passes every layer once: the prompt in one
			// forward, then one row per generated token but the last.
			lm, err := loadGenModel(path)
			if err != nil {
				t.Fatal(err)
			}
			p := lm.m.Params()
			lm.Close()
			rows := uint64(len(local.PromptTokens) + len(local.Tokens) - 1)
			if swarm.ExpertsLocal == nil || *swarm.ExpertsLocal != 0 {
				t.Errorf("experts_local %v, want 0", swarm.ExpertsLocal)
			}
			if want := rows * uint64(p.Layers*p.ExpertsUsed); swarm.ExpertsRemote == nil || *swarm.ExpertsRemote != want {
				t.Errorf("experts_remote %v, want %d", swarm.ExpertsRemote, want)
			}
			if len(swarm.Workers) != 2 {
				t.Fatalf("workers %+v, want 2", swarm.Workers)
			}
			for _, w := range swarm.Workers {
				// Each worker holds two of the four layers, every expert.
				if w.Rows != 2*rows || w.Pairs != 2*rows*uint64(p.ExpertsUsed) || w.Holdings != 2*p.Experts || w.Timeouts != 0 {
					t.Errorf("worker %+v: want rows %d, pairs %d, holdings %d", w, 2*rows, 2*rows*uint64(p.ExpertsUsed), 2*p.Experts)
				}
				if w.RTTp50ms <= 0 || w.RTTp99ms < w.RTTp50ms || w.BytesIn == 0 || w.BytesOut == 0 {
					t.Errorf("worker %+v: no round trips or bytes", w)
				}
			}
		})
	}
}

// TestSwarmWorkerKilled: two worker processes (--model-tiny, even and odd
// layers) serve a long greedy decode run by a dispatcher in this process;
// one worker is SIGKILLed after the first tokens, while requests are in
// flight. The decode finishes with the tokens and logits of a local decode,
// the killed worker's layers are then computed locally, and no step stalls
// longer than the dispatcher's deadline.
func TestSwarmWorkerKilled(t *testing.T) {
	const maxDeadline = 2 * time.Second
	log := newTestLog(t)
	lm, err := loadGenModel("")
	if err != nil {
		t.Fatal(err)
	}
	defer lm.Close()
	lm.m.SetThreads(1)
	opts := decodeOptions{prompt: "A worker falls, the decode goes on", maxTokens: 96}
	local, err := decode(context.Background(), lm, opts, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	const killAt = 8
	if len(local.Tokens) < 3*killAt {
		t.Fatalf("local decode stopped after %d tokens; choose another prompt", len(local.Tokens))
	}

	d, err := startDispatcher(lm, "127.0.0.1:0", quietLogger(), func(c *dispatch.Config) { c.MaxDeadline = maxDeadline })
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	sw := startTestSwarm(t, d.Addr(), log)
	var ws []*demo.Proc
	for i, layers := range []string{"0,2", "1,3"} {
		w, err := sw.AddWorker(fmt.Sprintf("worker-%d", i), "", "--model-tiny", "--layers", layers, "--threads", "1")
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := d.WaitWorkers(ctx, 2); err != nil {
		t.Fatal(err)
	}
	victim := d.Stats().Workers[0] // whichever; its process is the one with its key
	var victimProc *demo.Proc
	for _, w := range ws {
		key, err := worker.LoadOrCreateKeyFile(sw.KeyFile(w.Name))
		if err != nil {
			t.Fatal(err)
		}
		if hex.EncodeToString(key.Public().(ed25519.PublicKey)) == victim.ID {
			victimProc = w
		}
	}
	if victimProc == nil {
		t.Fatalf("no worker process has key %s", victim.ID)
	}
	lm.m.SetExperts(d)
	defer lm.m.SetExperts(nil)
	killed := make(chan struct{})
	var last time.Time
	var maxGap time.Duration
	opts.onToken = func(i int, _ int32) {
		now := time.Now()
		if i > 0 {
			maxGap = max(maxGap, now.Sub(last))
		}
		last = now
		if i == killAt {
			go func() { defer close(killed); victimProc.Kill() }()
		}
	}
	swarm, err := decode(ctx, lm, opts, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	<-killed
	if !slices.Equal(swarm.Tokens, local.Tokens) || swarm.LogitsSHA256 != local.LogitsSHA256 {
		t.Errorf("after a SIGKILL: tokens %v (logits %s), local %v (logits %s)", swarm.Tokens, swarm.LogitsSHA256, local.Tokens, local.LogitsSHA256)
	}
	if maxGap > maxDeadline+time.Second {
		t.Errorf("longest step %v, want at most the deadline %v (+1 s)", maxGap, maxDeadline)
	}
	st := d.Stats()
	if st.ExpertsLocal == 0 || st.ExpertsRemote == 0 {
		t.Errorf("experts remote %d, local %d: want both > 0 (killed after token %d)", st.ExpertsRemote, st.ExpertsLocal, killAt)
	}
	for _, w := range st.Workers {
		if w.ID == victim.ID && w.Connected {
			t.Errorf("killed worker %.16s still connected", w.ID)
		}
		if w.ID != victim.ID && (!w.Connected || w.Rows == 0) {
			t.Errorf("surviving worker %+v", w)
		}
	}
	t.Logf("%d tokens, killed after %d; longest step %v; experts remote %d, local %d", len(swarm.Tokens), killAt, maxGap, st.ExpertsRemote, st.ExpertsLocal)
}

// loopbackTLS returns a server TLS config with a fresh self-signed
// certificate for 127.0.0.1 (gateway.SelfSigned) and a pool trusting it.
func loopbackTLS(tb testing.TB) (*tls.Config, *x509.CertPool) {
	tb.Helper()
	certPEM, keyPEM, err := gateway.SelfSigned("127.0.0.1")
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		tb.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	return &tls.Config{Certificates: []tls.Certificate{cert}}, pool
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestGenerateSwarmFlags: --wait-workers needs --dispatch-listen (exit 2);
// an address that cannot be bound, or no worker within --wait-timeout,
// fails (exit 1) with the reason.
func TestGenerateSwarmFlags(t *testing.T) {
	var out, errb strings.Builder
	if c := generateMain([]string{"--wait-workers", "1"}, &out, &errb); c != 2 {
		t.Errorf("--wait-workers alone: exit %d, want 2", c)
	}
	if c := generateMain([]string{"--provision-rate", "many"}, &out, &errb); c != 2 || !strings.Contains(errb.String(), "--provision-rate") {
		t.Errorf("bad --provision-rate: exit %d, want 2 (%q)", c, errb.String())
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--dispatch-listen", "256.0.0.1:1"}, "dispatch"},
		{[]string{"--dispatch-listen", "127.0.0.1:0", "--wait-workers", "1", "--wait-timeout", "200ms"}, "waiting for 1 workers"},
	}
	for _, c := range cases {
		errb.Reset()
		if code := generateMain(append(c.args, "--max-tokens", "1"), &out, &errb); code != 1 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q (want %q)", c.args, code, errb.String(), c.want)
		}
	}
}
