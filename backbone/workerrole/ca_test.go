package workerrole

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/swarmtest"
)

// TestCAFileLater: a worker whose --ca file does not exist yet (started
// before its gateway first wrote its self-signed certificate) says so and
// keeps dialing; it connects once the file is copied in place. Before, Run
// failed at once on the missing file, although every dial reads it again.
func TestCAFileLater(t *testing.T) {
	dir := t.TempDir()
	sw, err := swarmtest.Start(filepath.Join(dir, "swarm"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	ca := filepath.Join(dir, "later", "gateway.crt")
	var log swarmtest.SyncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{Gateway: sw.URL, Slice: sw.SliceDir, CAFile: ca, KeyFile: filepath.Join(dir, "w.key"),
			Threads: 1, Log: &log, StatusEvery: time.Hour})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	time.Sleep(300 * time.Millisecond)
	if !strings.Contains(log.String(), "does not exist yet") {
		t.Fatalf("no word of the missing CA file: %q", log.String())
	}
	if n := len(sw.Disp.Stats().Workers); n != 0 {
		t.Fatalf("%d workers joined without the CA file", n)
	}
	pem, err := os.ReadFile(sw.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(ca), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ca, pem, 0o644); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer wcancel()
	if err := sw.Disp.WaitWorkers(wctx, 1); err != nil {
		t.Fatalf("the worker did not join once the CA file was there: %v (log %q)", err, log.String())
	}
}
