//go:build unix

package main

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/demo"
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
	srv, err := demo.Start("serve", newTestLog(t), []string{asBackbone}, backboneBin(t), "serve", "--model", bo,
		"--http", "127.0.0.1:0", "--dispatch-listen", "127.0.0.1:0", "--holder-wait", "60s", "--threads", "1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop(time.Second) })
	actx, acancel := context.WithTimeout(context.Background(), 30*time.Second)
	m, err := srv.Await(actx, regexp.MustCompile(`msg=serving http=(\S+) model=(\S+)`))
	acancel()
	if err != nil {
		t.Fatal(err)
	}
	base, modelID := "http://"+m[1], m[2]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	answered := make(chan string, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/completions",
			strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":"hello","max_tokens":4}`, modelID)))
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
		t.Fatalf("the request was answered before any signal: %s\n%s", a, srv.Tail(20))
	default:
	}
	if err := srv.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-srv.Done():
		t.Fatalf("serve exited %v within a second of the first SIGTERM, with a request in flight (no drain)\n%s", srv.Err(), srv.Tail(20))
	case <-time.After(time.Second):
	}
	// The operator is told that it drains, and what.
	lctx, lcancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err = srv.Await(lctx, regexp.MustCompile(`msg="shutting down: [^"]*" why=signal active=1 `))
	lcancel()
	if err != nil {
		t.Fatalf("no shutdown line naming the request in flight: %v\n%s", err, srv.Tail(20))
	}
	start := time.Now()
	if err := srv.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-srv.Done():
		t.Logf("exited %v %v after the second SIGTERM", srv.Err(), time.Since(start).Round(time.Millisecond))
	case <-time.After(3 * time.Second):
		t.Fatalf("serve still running 3 s after a second SIGTERM\n%s", srv.Tail(20))
	}
}
