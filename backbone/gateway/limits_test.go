package gateway

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/engine/wire"
)

func limitedGateway(t *testing.T, total, perIP int, timeout time.Duration) (*Gateway, *x509.CertPool) {
	certPEM, keyPEM, err := SelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	g, err := New(Config{Listen: "127.0.0.1:0", HubURL: "127.0.0.1:1", Secret: secret, Logger: quiet,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}, MaxHandshakes: total, MaxHandshakesPerIP: perIP, HandshakeTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g, pool
}

// silent opens a TCP connection that never starts its handshake.
func silent(t *testing.T, addr string) net.Conn {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitInProgress waits until n handshakes hold a slot.
func waitInProgress(t *testing.T, g *Gateway, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); g.hl.inProgress() != n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d handshakes in progress, want %d", g.hl.inProgress(), n)
		}
	}
}

// closedWithin reports whether the server closed c within d (EOF or reset
// on read), false when the read only timed out.
func closedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := c.Read(make([]byte, 1))
	return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
}

func handshakeOK(t *testing.T, g *Gateway, pool *x509.CertPool) error {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", g.Addr(), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	if err == nil {
		c.Close()
	}
	return err
}

// Handshakes from one address beyond MaxHandshakesPerIP are closed at once;
// slow ones end on HandshakeTimeout, which frees their slots.
func TestHandshakeLimitPerAddressAndTimeout(t *testing.T) {
	g, pool := limitedGateway(t, 100, 2, 3*time.Second)
	a, b := silent(t, g.Addr()), silent(t, g.Addr())
	waitInProgress(t, g, 2)
	if !closedWithin(silent(t, g.Addr()), 2*time.Second) {
		t.Fatal("a third handshake from the same address was not refused")
	}
	if err := handshakeOK(t, g, pool); err == nil {
		t.Fatal("a real handshake got past a full per-address bound")
	}
	for _, c := range []net.Conn{a, b} {
		if !closedWithin(c, 10*time.Second) {
			t.Fatal("a silent handshake outlived HandshakeTimeout")
		}
	}
	if err := handshakeOK(t, g, pool); err != nil {
		t.Fatalf("slots not freed after the timeout: %v", err)
	}
	// The TLS library closes a timed-out connection from its own goroutine
	// as the deadline passes, before the handshake returns and is counted:
	// the client can see the close first. Wait for the count.
	m := scrape(t, g)
	for end := time.Now().Add(5 * time.Second); !strings.Contains(m, `reason="handshake_timeout"} 2`) && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
		m = scrape(t, g)
	}
	for _, want := range []string{`reason="handshake_per_address"} 2`, `reason="handshake_timeout"} 2`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s:\n%s", want, m)
		}
	}
}

// MaxHandshakes bounds handshakes in progress from all addresses together.
func TestHandshakeLimitTotal(t *testing.T) {
	g, pool := limitedGateway(t, 1, 100, 5*time.Second)
	a := silent(t, g.Addr())
	waitInProgress(t, g, 1)
	if !closedWithin(silent(t, g.Addr()), 2*time.Second) {
		t.Fatal("a second handshake was not refused at MaxHandshakes 1")
	}
	a.Close()
	waitInProgress(t, g, 0) // the first handshake fails and frees its slot
	if err := handshakeOK(t, g, pool); err != nil {
		t.Fatalf("after the slot was freed: %v", err)
	}
	if m := scrape(t, g); !strings.Contains(m, `reason="handshake_total"} 1`) {
		t.Errorf("metrics:\n%s", m)
	}
}

// The per-address handshake bound counts an IPv6 /64 as one address (a
// host picks source addresses from its whole /64) and IPv4 addresses,
// IPv4-mapped ones included, one by one.
func TestAddressGroup(t *testing.T) {
	for _, tc := range []struct{ addr, want string }{
		{"192.0.2.7:443", "192.0.2.7"},
		{"[::ffff:192.0.2.7]:443", "::ffff:192.0.2.7"},
		{"[2001:db8:1:2:aaaa::1]:5000", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:ffff:ffff:ffff:ffff]:1", "2001:db8:1:2::/64"},
		{"[2001:db8:1:3::1]:1", "2001:db8:1:3::/64"},
		{"not-an-address", "not-an-address"},
	} {
		if got := addressGroup(tc.addr); got != tc.want {
			t.Errorf("addressGroup(%q) = %q, want %q", tc.addr, got, tc.want)
		}
	}
}

// A wildcard certificate name admits the names it covers (one leftmost
// label, as TLS verifies it), and a name with a trailing dot is the name.
func TestNameMatches(t *testing.T) {
	names := hostNames([]string{"gate.example.org."}, &tls.Config{})
	names["*.example.net"] = true
	for host, want := range map[string]bool{
		"gw.example.net": true, "example.net": false, "a.b.example.net": false, "gate.example.org": true,
		"other.example.org": false, "1.2.3.4": false,
	} {
		if got := nameMatches(names, wire.UpgradeHost(host)); got != want {
			t.Errorf("%s: %v, want %v", host, got, want)
		}
	}
	if !nameMatches(names, wire.UpgradeHost("GW.Example.NET.:443")) {
		t.Error("trailing dot and case")
	}
}
