package gateway

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// startSelfSigned starts a gateway on addr with the pair of dir, as
// `backbone gateway --self-signed-out dir` does: LoadOrNewSelfSigned, then
// Write once the listener is bound. It returns the pair, or the Start
// error (the files then untouched).
func startSelfSigned(t *testing.T, dir, addr string, hosts ...string) (*Gateway, *SelfSignedPair, error) {
	t.Helper()
	p, err := LoadOrNewSelfSigned(dir, hosts, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cert, err := p.Certificate()
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(Config{Listen: addr, HubURL: "127.0.0.1:1", Secret: secret, Logger: quiet,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(); err != nil {
		return nil, p, err
	}
	t.Cleanup(func() { g.Close() })
	if err := p.Write(); err != nil {
		t.Fatal(err)
	}
	return g, p, nil
}

// pinned is a pool holding only the certificate file's certificate, as a
// worker's --ca CERT.
func pinned(t *testing.T, certFile string) *x509.CertPool {
	t.Helper()
	b, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		t.Fatalf("%s: no certificate", certFile)
	}
	return pool
}

// handshake completes a TLS handshake with the gateway at addr trusting
// only pool.
func handshake(addr string, pool *x509.CertPool) error {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	if err != nil {
		return err
	}
	return c.Close()
}

func readPair(t *testing.T, p *SelfSignedPair) (c, k []byte) {
	t.Helper()
	c, err := os.ReadFile(p.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	k, err = os.ReadFile(p.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	return c, k
}

// A restarted gateway keeps its pair: a client pinned to the first
// certificate still connects; and the files are the same bytes.
func TestSelfSignedKeptAcrossRestart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	g, p, err := startSelfSigned(t, dir, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if p.Reused || !strings.HasPrefix(p.Reason, "missing") {
		t.Fatalf("first start: Reused %v, Reason %q; want a new pair, missing", p.Reused, p.Reason)
	}
	if st, err := os.Stat(p.KeyFile); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v, want 0600", st.Mode(), err)
	}
	pool := pinned(t, p.CertFile)
	if err := handshake(g.Addr(), pool); err != nil {
		t.Fatal(err)
	}
	c1, k1 := readPair(t, p)
	addr := g.Addr()
	g.Close()

	g2, p2, err := startSelfSigned(t, dir, addr)
	if err != nil {
		t.Fatal(err)
	}
	if !p2.Reused || p2.Reason != "" {
		t.Fatalf("restart: Reused %v, Reason %q; want the pair kept", p2.Reused, p2.Reason)
	}
	if c2, k2 := readPair(t, p2); !bytes.Equal(c1, c2) || !bytes.Equal(k1, k2) {
		t.Fatal("restart rewrote the pair")
	}
	if err := handshake(g2.Addr(), pool); err != nil {
		t.Fatalf("client pinned to the first certificate: %v", err)
	}
}

// A gateway that cannot bind (a second one on a live gateway's port)
// leaves the files byte-identical, even when it would have made a new pair
// (here: other hosts).
func TestSelfSignedFailedBindWritesNothing(t *testing.T) {
	dir := t.TempDir()
	g, p, err := startSelfSigned(t, dir, "127.0.0.1:0", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	c1, k1 := readPair(t, p)
	_, p2, err := startSelfSigned(t, dir, g.Addr(), "127.0.0.1", "gw.example")
	if err == nil {
		t.Fatal("second gateway on the same port started")
	}
	if p2.Reused || !strings.HasPrefix(p2.Reason, "hosts differ") {
		t.Fatalf("second gateway: Reused %v, Reason %q; want a new pair, hosts differ", p2.Reused, p2.Reason)
	}
	if c2, k2 := readPair(t, p); !bytes.Equal(c1, c2) || !bytes.Equal(k1, k2) {
		t.Fatal("a gateway that failed to bind changed the files")
	}
	if err := handshake(g.Addr(), pinned(t, p.CertFile)); err != nil {
		t.Fatal(err)
	}
}

// A pair that cannot be kept is replaced, with a Reason naming what was
// wrong, and the new files hold a matching pair (no temporary file left).
func TestSelfSignedReplaced(t *testing.T) {
	now := time.Now()
	mk := func(hosts []string, from, to time.Time) (c, k []byte) {
		c, k, err := selfSigned(hosts, from, to)
		if err != nil {
			t.Fatal(err)
		}
		return c, k
	}
	hosts := []string{"127.0.0.1"}
	good, goodKey := mk(hosts, now.Add(-time.Hour), now.Add(SelfSignedValidity))
	_, otherKey := mk(hosts, now.Add(-time.Hour), now.Add(SelfSignedValidity))
	expired, expiredKey := mk(hosts, now.Add(-48*time.Hour), now.Add(-time.Hour))
	soon, soonKey := mk(hosts, now.Add(-time.Hour), now.Add(3*24*time.Hour))
	future, futureKey := mk(hosts, now.Add(time.Hour), now.Add(SelfSignedValidity))
	local, localKey := mk([]string{"localhost"}, now.Add(-time.Hour), now.Add(SelfSignedValidity))
	for _, tc := range []struct {
		name      string
		cert, key []byte // nil: no file
		reason    string // Reason's prefix
	}{
		{"missing key", good, nil, "missing: "},
		{"missing cert", nil, goodKey, "missing: "},
		{"mismatched", good, otherKey, "unreadable or mismatched: "},
		{"garbage cert", []byte("not a certificate\n"), goodKey, "unreadable or mismatched: "},
		{"truncated key", good, goodKey[:len(goodKey)/2], "unreadable or mismatched: "},
		{"expired", expired, expiredKey, "expired: "},
		{"expiring", soon, soonKey, "expiring: "},
		{"not yet valid", future, futureKey, "not yet valid: "},
		{"hosts differ", local, localKey, "hosts differ: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, b := range map[string][]byte{SelfSignedCertName: tc.cert, SelfSignedKeyName: tc.key} {
				if b != nil {
					if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
						t.Fatal(err)
					}
				}
			}
			p, err := LoadOrNewSelfSigned(dir, hosts, now)
			if err != nil {
				t.Fatal(err)
			}
			if p.Reused || !strings.HasPrefix(p.Reason, tc.reason) {
				t.Fatalf("Reused %v, Reason %q; want a new pair, %q...", p.Reused, p.Reason, tc.reason)
			}
			if err := p.Write(); err != nil {
				t.Fatal(err)
			}
			c, k := readPair(t, p)
			if bytes.Equal(c, tc.cert) || bytes.Equal(k, tc.key) {
				t.Fatal("the old file is still there")
			}
			if _, err := tls.X509KeyPair(c, k); err != nil {
				t.Fatal(err)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 2 {
				t.Fatalf("%d files in the directory, want 2", len(ents))
			}
			if q, err := LoadOrNewSelfSigned(dir, hosts, now); err != nil || !q.Reused {
				t.Fatalf("the new pair is not kept: %v %+v", err, q)
			}
		})
	}
	// The good pair is kept, also for hosts given in another order and
	// with blanks, and for a subset of its hosts.
	dir := t.TempDir()
	c, k := mk([]string{"127.0.0.1", "::1", "localhost"}, now.Add(-time.Hour), now.Add(SelfSignedValidity))
	os.WriteFile(filepath.Join(dir, SelfSignedCertName), c, 0o644)
	os.WriteFile(filepath.Join(dir, SelfSignedKeyName), k, 0o600)
	for _, h := range [][]string{nil, {"localhost", " ::1", "127.0.0.1", ""}, {"127.0.0.1"}} {
		if p, err := LoadOrNewSelfSigned(dir, h, now); err != nil || !p.Reused {
			t.Fatalf("hosts %q: %v %+v", h, err, p)
		}
	}
}
