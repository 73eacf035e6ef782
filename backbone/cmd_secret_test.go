package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A hub or gateway whose secret file is missing exits 1 naming the path
// and creates nothing; with --create-secret the hub creates it.
func TestMissingSecretFile(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "no", "hub-secret")
	for _, args := range [][]string{
		{"hub", "--listen", "127.0.0.1:0", "--ledger", "", "--secret-file", secret},
		{"gateway", "--listen", "127.0.0.1:0", "--self-signed-out", filepath.Join(dir, "tls"), "--wallets", filepath.Join(dir, "w.sqlite"), "--secret-file", secret},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, backboneBin(t), args...)
		cmd.Env = append(os.Environ(), asBackbone)
		out, err := cmd.CombinedOutput()
		cancel()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), secret) || !strings.Contains(string(out), "--create-secret") {
			t.Errorf("%s: %v\n%s", args[0], err, out)
		}
		if _, err := os.Stat(secret); err == nil {
			t.Fatalf("%s created %s", args[0], secret)
		}
	}
	// --create-secret: the hub makes it (and then listens; --print-config
	// would not get this far, so stop it once the file exists).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, backboneBin(t), "hub", "--listen", "127.0.0.1:0", "--ledger", "", "--secret-file", secret, "--create-secret")
	cmd.Env = append(os.Environ(), asBackbone)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if st, err := os.Stat(secret); err == nil && st.Size() > 0 && st.Mode().Perm() == 0o600 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("--create-secret made no secret file")
		}
	}
	cancel()
}
