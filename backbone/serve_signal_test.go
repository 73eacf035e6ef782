//go:build unix

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestServeSecondSignal: `backbone serve` drains on SIGTERM (the API waits
// up to serve.DefaultShutdownDrain, 10 s, for requests in flight) and a
// second SIGTERM ends the process at once. The request in flight is one
// that cannot finish: a backbone-only model with no worker connected, so
// its first step waits for a holder (--holder-wait 60s). After the first
// signal the process must still be there a second later (draining, not
// killed); after the second it must be gone within 3 s, long before the
// drain would have ended.
func TestServeSecondSignal(t *testing.T) {
	dir := t.TempDir()
	full, bo := filepath.Join(dir, "full.gguf"), filepath.Join(dir, "bo.gguf")
	runBackbone(t, time.Minute, "genmodel", "--out", full)
	runBackbone(t, time.Minute, "slice", "--model", full, "--backbone-only", "--out", bo)
	port := freePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	cmd := exec.Command(backboneBin(t), "serve", "--model", bo, "--http", fmt.Sprintf("127.0.0.1:%d", port),
		"--dispatch-listen", "127.0.0.1:0", "--holder-wait", "60s", "--threads", "1")
	cmd.Env = append(os.Environ(), asBackbone)
	var logs strings.Builder
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	deadline := time.Now().Add(30 * time.Second)
	var models struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	for {
		resp, err := http.Get(base + "/v1/models")
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&models)
			resp.Body.Close()
			if err != nil || len(models.Data) == 0 {
				t.Fatalf("/v1/models: %v %+v", err, models)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not come up: %v\n%s", err, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	answered := make(chan string, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/completions",
			strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":"hello","max_tokens":4}`, models.Data[0].ID)))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- "error: " + err.Error()
			return
		}
		resp.Body.Close()
		answered <- resp.Status
	}()
	time.Sleep(time.Second) // the request is in its first step, waiting for a holder
	select {
	case a := <-answered:
		t.Fatalf("the request was answered before any signal: %s\n%s", a, logs.String())
	default:
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		t.Fatalf("serve exited %v within a second of the first SIGTERM, with a request in flight (no drain)\n%s", err, logs.String())
	case <-time.After(time.Second):
	}
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		t.Logf("exited %v %v after the second SIGTERM", err, time.Since(start).Round(time.Millisecond))
	case <-time.After(3 * time.Second):
		t.Fatalf("serve still running 3 s after a second SIGTERM\n%s", logs.String())
	}
	exited <- nil // for the cleanup
}
