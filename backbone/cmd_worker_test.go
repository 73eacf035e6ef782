package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// stderrOf runs fn with os.Stderr redirected to a pipe and returns fn's
// exit code and what it wrote there.
func stderrOf(t *testing.T, fn func() int) (int, string) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stderr
	os.Stderr = w
	got := make(chan string)
	go func() { b, _ := io.ReadAll(r); got <- string(b) }()
	code := fn()
	os.Stderr = old
	w.Close()
	s := <-got
	r.Close()
	return code, s
}

// TestWorkerErrorMessages: the worker command's errors name the flag that
// led to them and carry one "worker: " prefix; the hub's public-address
// refusal names --allow-public.
func TestWorkerErrorMessages(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "worker.key")
	missing := filepath.Join(dir, "nonexist")
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		run   func() int
		want  string
		usage bool // a flag's value refused before anything runs: exit 2
	}{
		{"slice", func() int {
			return runWorker([]string{"--gateway", "wss://127.0.0.1:1", "--slice", missing, "--key", key})
		}, "worker: --slice " + missing + ": ", false},
		{"ca", func() int {
			return runWorker([]string{"--gateway", "wss://127.0.0.1:1", "--model-tiny", "--ca", missing, "--key", key})
		}, "worker: --ca " + missing + ": open " + missing, false},
		{"ca not pem", func() int {
			return runWorker([]string{"--gateway", "wss://127.0.0.1:1", "--model-tiny", "--ca", notPEM, "--key", key})
		}, "worker: --ca " + notPEM + ": no PEM certificate in the file", false},
		{"quota ca", func() int {
			return runWorker([]string{"--gateway", "wss://127.0.0.1:1", "--slice", filepath.Join(dir, "s"), "--quota", "1MiB", "--ca", missing, "--key", key})
		}, "worker: --ca " + missing + ": open " + missing, false},
		{"gateway url", func() int {
			return runWorker([]string{"--gateway", "http://127.0.0.1:1", "--model-tiny", "--key", key})
		}, `worker: gateway URL "http://127.0.0.1:1" must be wss://host[:port]`, false},
		{"gateway ws", func() int {
			return runWorker([]string{"--gateway", "ws://127.0.0.1:1", "--model-tiny", "--key", key})
		}, "worker: --gateway ws://127.0.0.1:1: want wss://host[:port]: the gateway speaks TLS only", false},
		{"cpu limit", func() int {
			return runWorker([]string{"--gateway", "wss://127.0.0.1:1", "--model-tiny", "--key", key, "--cpu-limit", "150"})
		}, "worker: --cpu-limit 150: want a percent from 0 to 100", true},
		{"spin wait negative", func() int {
			return runWorker([]string{"--gateway", "wss://127.0.0.1:1", "--model-tiny", "--key", key, "--spin-wait", "-5ms"})
		}, "worker: --spin-wait -5ms: want >= 0 (0: off)", true},
		{"hub public", func() int {
			return runHub([]string{"--listen", "0.0.0.0:0", "--ledger", "", "--secret-file", filepath.Join(dir, "secret")})
		}, "pass --allow-public", false},
	} {
		code, out := stderrOf(t, tc.run)
		want := 1
		if tc.usage {
			want = 2
		}
		if code != want || !strings.Contains(out, tc.want) || strings.Contains(out, "worker: worker:") || strings.Contains(out, "AllowPublic") {
			t.Errorf("%s: exit %d, stderr %q; want exit %d and %q", tc.name, code, out, want, tc.want)
		}
	}
}
