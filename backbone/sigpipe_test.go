//go:build unix

package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestDaemonSurvivesClosedLogPipe: a hub whose stdout and stderr pipe was
// closed (its parent, `backbone up`, killed with SIGKILL) still shuts down
// in order on SIGTERM and exits 0. It died of SIGPIPE at its first
// shutdown log line (exit by signal 13), before its last ledger flush,
// and the open sessions' metered bytes were lost.
func TestDaemonSurvivesClosedLogPipe(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(backboneBin(t), "hub", "--listen", "127.0.0.1:0", "--backbone", "127.0.0.1:1",
		"--ledger", filepath.Join(dir, "ledger.sqlite"), "--secret-file", filepath.Join(dir, "secret"), "--create-secret")
	cmd.Env = append(os.Environ(), asBackbone)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if _, err := bufio.NewReader(r).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	r.Close() // the log pipe is gone
	time.Sleep(200 * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("hub after its log pipe closed: %v (want exit 0)", err)
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("hub did not exit after SIGTERM")
	}
}
