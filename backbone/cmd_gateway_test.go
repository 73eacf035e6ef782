package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/demo"
	"github.com/kvasir-ai/kvasir/backbone/gateway"
)

// `backbone gateway --self-signed-out DIR` as the docs run it: a restart
// keeps the pair (a client pinned to the first certificate connects to the
// restarted gateway), a second gateway on a live one's port (or with its
// metrics port taken) exits without touching the files, and a mismatched pair is replaced with a line saying
// so.
func TestGatewaySelfSignedOut(t *testing.T) {
	dir := t.TempDir()
	tlsDir := filepath.Join(dir, "tls")
	certFile, keyFile := filepath.Join(tlsDir, "gateway.crt"), filepath.Join(tlsDir, "gateway.key")
	log := newTestLog(t)
	args := func(listen string, extra ...string) []string {
		return append([]string{"gateway", "--listen", listen, "--hub", "127.0.0.1:1", "--self-signed-out", tlsDir,
			"--secret-file", filepath.Join(dir, "hub-secret"), "--create-secret"}, extra...)
	}
	listening := regexp.MustCompile(`^gateway: listening on (\S+) \(TLS\)`)
	start := func(want string) (*demo.Proc, string) {
		t.Helper()
		p, err := demo.Start("gateway", log, []string{asBackbone}, backboneBin(t), args("127.0.0.1:0")...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Stop(5 * time.Second) })
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := p.Await(ctx, regexp.MustCompile(want)); err != nil {
			t.Fatal(err)
		}
		m, err := p.Await(ctx, listening)
		if err != nil {
			t.Fatal(err)
		}
		return p, m[1]
	}
	files := func() (c, k []byte) {
		t.Helper()
		c, err := os.ReadFile(certFile)
		if err != nil {
			t.Fatal(err)
		}
		if k, err = os.ReadFile(keyFile); err != nil {
			t.Fatal(err)
		}
		return c, k
	}
	handshake := func(addr string, pool *x509.CertPool) error {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
		if err == nil {
			c.Close()
		}
		return err
	}

	gw1, addr1 := start(`^gateway: new self-signed certificate \S+ \(missing: `)
	c1, k1 := files()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c1)
	if err := handshake(addr1, pool); err != nil {
		t.Fatal(err)
	}

	// A second gateway on the live one's port, for other hosts (so it
	// would make a new pair): it exits 1 and the files stay as they are.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	cmd := exec.CommandContext(ctx, backboneBin(t), args(addr1, "--self-signed-hosts", "127.0.0.1,gw.example")...)
	cmd.Env = append(os.Environ(), asBackbone)
	out, err := cmd.CombinedOutput()
	cancel()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "address already in use") {
		t.Fatalf("second gateway on %s: %v\n%s", addr1, err, out)
	}
	if c, k := files(); !bytes.Equal(c, c1) || !bytes.Equal(k, k1) {
		t.Fatalf("a gateway that could not listen changed the files:\n%s", out)
	}
	// The same with a free main port and a metrics port in use: the pair
	// was written before the metrics port was bound (workers re-read --ca
	// at each reconnect, and then no longer trusted the live gateway).
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	cmd = exec.CommandContext(ctx, backboneBin(t), args("127.0.0.1:0", "--self-signed-hosts", "127.0.0.1,gw.example", "--metrics-listen", busy.Addr().String())...)
	cmd.Env = append(os.Environ(), asBackbone)
	out, err = cmd.CombinedOutput()
	cancel()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "--metrics-listen") || !strings.Contains(string(out), "address already in use") {
		t.Fatalf("second gateway with a busy metrics port: %v\n%s", err, out)
	}
	if c, k := files(); !bytes.Equal(c, c1) || !bytes.Equal(k, k1) {
		t.Fatalf("a gateway whose metrics port was taken changed the files:\n%s", out)
	}
	if err := handshake(addr1, pool); err != nil {
		t.Fatal(err)
	}

	// Restart: the same pair; the pinned client still connects.
	if err := gw1.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	gw2, addr2 := start(`^gateway: reusing the self-signed certificate `)
	if c, k := files(); !bytes.Equal(c, c1) || !bytes.Equal(k, k1) {
		t.Fatal("the restarted gateway rewrote the pair")
	}
	if err := handshake(addr2, pool); err != nil {
		t.Fatalf("client pinned to the first certificate: %v", err)
	}

	// A key that is not the certificate's: replaced, and said so.
	if err := gw2.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	_, other, err := gateway.SelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, other, 0o600); err != nil {
		t.Fatal(err)
	}
	_, addr3 := start(`^gateway: new self-signed certificate \S+ \(unreadable or mismatched: `)
	c3, _ := files()
	if bytes.Equal(c3, c1) {
		t.Fatal("the mismatched pair was kept")
	}
	if handshake(addr3, pool) == nil {
		t.Fatal("the new certificate verified against the old one")
	}
	pool3 := x509.NewCertPool()
	pool3.AppendCertsFromPEM(c3)
	if err := handshake(addr3, pool3); err != nil {
		t.Fatal(err)
	}
}

// TestGatewayACMEFailureSaysWhy: a gateway whose ACME server cannot be
// reached (a closed port) logs the order's real error at once and names it
// in /readyz, instead of a silent start whose only later word was autocert's
// "missing certificate".
func TestGatewayACMEFailureSaysWhy(t *testing.T) {
	dir := t.TempDir()
	log := newTestLog(t)
	closed := freePort(t)
	p, err := demo.Start("gateway", log, []string{asBackbone}, backboneBin(t), "gateway", "--listen", "127.0.0.1:0",
		"--hub", "127.0.0.1:1", "--secret-file", filepath.Join(dir, "hub-secret"), "--create-secret",
		"--acme-domain", "gate.example.invalid", "--acme-cache", filepath.Join(dir, "acme"),
		"--acme-directory", fmt.Sprintf("https://127.0.0.1:%d/dir", closed), "--metrics-listen", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(5 * time.Second) })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m, err := p.Await(ctx, regexp.MustCompile(`^gateway: metrics on http://(\S+)/metrics`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Await(ctx, regexp.MustCompile(`ACME certificate not obtained yet.*connection refused`)); err != nil {
		t.Fatalf("no log line with the cause: %v\n%s", err, p.Tail(20))
	}
	code, body := httpGet(t, "http://"+m[1]+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "0 of 1 ACME certificates obtained") || !strings.Contains(body, "connection refused") {
		t.Fatalf("/readyz %d: %s", code, body)
	}
}

// TestGatewayBadLimits: handshake bounds below 1 and negative timeouts are
// refused (exit 2, the flag named). --max-handshakes -1 ran with 256 while
// --print-config showed -1.
func TestGatewayBadLimits(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ flag, val, want string }{
		{"--max-handshakes", "-1", "--max-handshakes -1: want 1 or more"},
		{"--max-handshakes", "0", "--max-handshakes 0: want 1 or more"},
		{"--max-handshakes-per-address", "0", "--max-handshakes-per-address 0: want 1 or more"},
		{"--idle-timeout", "-5s", "--idle-timeout and --handshake-timeout"},
		{"--handshake-timeout", "-1s", "--idle-timeout and --handshake-timeout"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // a gateway that starts is killed
		cmd := exec.CommandContext(ctx, backboneBin(t), "gateway", "--listen", "127.0.0.1:0", "--hub", "127.0.0.1:1", "--self-signed-out", filepath.Join(dir, "tls"),
			"--secret-file", filepath.Join(dir, "hub-secret"), "--create-secret", c.flag, c.val)
		cmd.Env = append(os.Environ(), asBackbone)
		cmd.WaitDelay = 5 * time.Second
		out, err := cmd.CombinedOutput()
		cancel()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), c.want) {
			t.Errorf("%s %s: %v\n%s", c.flag, c.val, err, out)
		}
	}
}
