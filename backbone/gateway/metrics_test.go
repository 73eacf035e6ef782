package gateway

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/kvasir-ai/kvasir/engine/wire"
)

// TestGatewayMetrics: sessions, bytes both ways, refused upgrades by
// reason (unsigned, bad signature, stale, replayed, hub unreachable) and
// an idle timeout counted as a splice error.
func TestGatewayMetrics(t *testing.T) {
	eh := newEchoHub(t)
	certPEM, keyPEM, _ := SelfSigned()
	cert, _ := tls.X509KeyPair(certPEM, keyPEM)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	g, err := New(Config{Listen: "127.0.0.1:0", HubURL: eh.ln.Addr().String(), Secret: secret,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}, IdleTimeout: 300 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(); err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	_, key, _ := ed25519.GenerateKey(nil)
	h := wire.SignUpgrade(key, "GET", "127.0.0.1", wire.WorkerPath, time.Now())
	c, _, err := dial(t, g, pool, h)
	if err != nil {
		t.Fatal(err)
	}
	msg := make([]byte, 1000)
	if err := c.Write(context.Background(), websocket.MessageBinary, msg); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Read(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Read(context.Background()); err == nil { // silent: the idle timeout ends the splice
		t.Fatal("idle splice not closed")
	}
	c.CloseNow()
	if _, _, err := dial(t, g, pool, h); err == nil { // the same nonce again
		t.Fatal("replay accepted")
	}
	if _, _, err := dial(t, g, pool, nil); err == nil {
		t.Fatal("unsigned accepted")
	}
	bad := wire.SignUpgrade(key, "GET", "127.0.0.1", wire.WorkerPath, time.Now())
	bad.Set("X-Kvasir-Sig", strings.Repeat("00", 64))
	if _, _, err := dial(t, g, pool, bad); err == nil {
		t.Fatal("bad signature accepted")
	}
	if _, _, err := dial(t, g, pool, wire.SignUpgrade(key, "GET", "127.0.0.1", wire.WorkerPath, time.Now().Add(-time.Hour))); err == nil {
		t.Fatal("stale signature accepted")
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := ln.Addr().String()
	ln.Close()
	g2, pool2 := newGateway(t, dead, nil)
	if _, _, err := dial(t, g2, pool2, wire.SignUpgrade(key, "GET", "127.0.0.1", wire.WorkerPath, time.Now())); err == nil {
		t.Fatal("hub down: upgrade accepted")
	}
	// The splice's end is counted (sessions open, its error reason) by its
	// own goroutine after the client saw the close: wait for both.
	deadline := time.Now().Add(5 * time.Second)
	body := scrape(t, g)
	for (g.Stats().Active != 0 || !strings.Contains(body, `reason="idle_timeout"`)) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		body = scrape(t, g)
	}
	for _, want := range []string{
		"kvasir_gateway_sessions_total 1",
		"kvasir_gateway_sessions_open 0",
		`kvasir_gateway_refused_upgrades_total{reason="replayed"} 1`,
		`kvasir_gateway_refused_upgrades_total{reason="unsigned"} 1`,
		`kvasir_gateway_refused_upgrades_total{reason="bad_signature"} 1`,
		`kvasir_gateway_refused_upgrades_total{reason="stale"} 1`,
		`kvasir_gateway_splice_errors_total{reason="idle_timeout"} 1`,
		`kvasir_gateway_bytes_bridged_total{dir="up"}`,
		`kvasir_gateway_bytes_bridged_total{dir="down"}`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}
	if b2 := scrape(t, g2); !strings.Contains(b2, `kvasir_gateway_refused_upgrades_total{reason="hub_unreachable"} 1`) {
		t.Errorf("hub down not counted:\n%s", b2)
	}
}

func scrape(t *testing.T, g *Gateway) string {
	t.Helper()
	rec := httptest.NewRecorder()
	g.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	return rec.Body.String()
}
