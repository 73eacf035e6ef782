package gateway

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/kvasir-ai/kvasir/backbone/hub"
	"github.com/kvasir-ai/kvasir/engine/wire"
	dto "github.com/prometheus/client_model/go"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// echoHub is a stand-in hub: it checks the gateway's HMAC, records the
// worker id it was told, accepts the WebSocket and echoes every message;
// got receives a copy of each message read (while it has room).
type echoHub struct {
	ln      net.Listener
	worker  atomic.Value
	upgrade atomic.Int64
	got     chan []byte
}

func newEchoHub(tb testing.TB) *echoHub {
	h := &echoHub{got: make(chan []byte, 64)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	h.ln = ln
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hub.Authorized(r, secret) {
			http.Error(w, "no", http.StatusForbidden)
			return
		}
		h.worker.Store(r.Header.Get(hub.HeaderWorker))
		h.upgrade.Add(1)
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		c.SetReadLimit(wire.MaxMessage)
		defer c.CloseNow()
		for {
			typ, b, err := c.Read(context.Background())
			if err != nil {
				return
			}
			select {
			case h.got <- b:
			default:
			}
			if c.Write(context.Background(), typ, b) != nil {
				return
			}
		}
	})}
	go srv.Serve(ln)
	tb.Cleanup(func() { srv.Close() })
	return h
}

func newGateway(tb testing.TB, hubAddr string, extra map[string]http.Handler) (*Gateway, *x509.CertPool) {
	certPEM, keyPEM, err := SelfSigned()
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		tb.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	g, err := New(Config{Listen: "127.0.0.1:0", HubURL: "http://" + hubAddr, Secret: secret,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}, Extra: extra, Logger: quiet})
	if err != nil {
		tb.Fatal(err)
	}
	if err := g.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { g.Close() })
	return g, pool
}

func dial(tb testing.TB, g *Gateway, pool *x509.CertPool, h http.Header) (*websocket.Conn, *http.Response, error) {
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	c, resp, err := websocket.Dial(context.Background(), "wss://"+g.Addr()+wire.WorkerPath,
		&websocket.DialOptions{HTTPClient: client, HTTPHeader: h})
	if c != nil {
		c.SetReadLimit(wire.MaxMessage)
	}
	return c, resp, err
}

func TestSpliceNamesWorkerAndEchoes(t *testing.T) {
	eh := newEchoHub(t)
	g, pool := newGateway(t, eh.ln.Addr().String(), map[string]http.Handler{
		"/v1/wallet/": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "wallet") }),
	})
	_, key, _ := ed25519.GenerateKey(nil)
	h := wire.SignUpgrade(key, "GET", "127.0.0.1", wire.WorkerPath, time.Now())
	h.Set(hub.HeaderWorker, strings.Repeat("ee", 32)) // spoofing attempt: must be replaced
	h.Set(hub.HeaderGwMAC, strings.Repeat("00", 32))
	c, _, err := dial(t, g, pool, h)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	msg := []byte("ping through the splice")
	if err := c.Write(context.Background(), websocket.MessageBinary, msg); err != nil {
		t.Fatal(err)
	}
	_, got, err := c.Read(context.Background())
	if err != nil || string(got) != string(msg) {
		t.Fatalf("echo %q %v", got, err)
	}
	if w := eh.worker.Load(); w != hex.EncodeToString(key.Public().(ed25519.PublicKey)) {
		t.Fatalf("hub was told worker %v", w)
	}
	// Extra handlers share the TLS listener.
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := client.Get("https://" + g.Addr() + "/v1/wallet/x")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "wallet" {
		t.Fatalf("extra handler: %q", b)
	}
	// A plain GET on the worker path is not an upgrade.
	resp, err = client.Get("https://" + g.Addr() + wire.WorkerPath)
	if err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("plain GET: %v %v", resp.Status, err)
	}
	resp.Body.Close()
	// The splice counts a chunk after writing it on, so the echo may reach
	// the client a moment before its bytes are counted.
	deadline := time.Now().Add(5 * time.Second)
	st := g.Stats()
	for (st.BytesUp == 0 || st.BytesDown == 0) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
		st = g.Stats()
	}
	if st.Upgrades != 1 || st.BytesUp == 0 || st.BytesDown == 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestHubDownIs502(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	g, pool := newGateway(t, addr, nil)
	_, key, _ := ed25519.GenerateKey(nil)
	_, resp, err := dial(t, g, pool, wire.SignUpgrade(key, "GET", "127.0.0.1", wire.WorkerPath, time.Now()))
	if err == nil || resp == nil || resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("want 502, got %v %v", resp, err)
	}
}

// TestHubSecretMismatchIs502: a hub whose shared secret differs from the
// gateway's refuses the gateway's signature (403); the worker, admitted by
// the gateway, gets 502 saying the gateway is misconfigured, not that its
// identity was refused (the 403 it got before made contributors chase a
// key problem they did not have).
func TestHubSecretMismatchIs502(t *testing.T) {
	h, err := hub.New(hub.Config{Listen: "127.0.0.1:0", Backbone: "127.0.0.1:1",
		Secret: []byte("another secret, not the gateway's"), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	g, pool := newGateway(t, h.Addr(), nil)
	_, key, _ := ed25519.GenerateKey(nil)
	_, resp, err := dial(t, g, pool, wire.SignUpgrade(key, "GET", "127.0.0.1", wire.WorkerPath, time.Now()))
	if err == nil || resp == nil || resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("want 502, got %v %v", resp, err)
	}
	if st := g.Stats(); st.Refused != 1 || st.Upgrades != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSelfSigned(t *testing.T) {
	c, k, err := SelfSigned("127.0.0.1", "gw.example")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tls.X509KeyPair(c, k); err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(c)
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if err := cert.VerifyHostname("127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	if err := cert.VerifyHostname("gw.example"); err != nil {
		t.Fatal(err)
	}
	if cert.VerifyHostname("other.example") == nil {
		t.Fatal("verified a host not in the certificate")
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: "gw.example"}); err != nil {
		t.Fatal(err)
	}
}

func TestIdleTimeoutClosesSplice(t *testing.T) {
	eh := newEchoHub(t)
	certPEM, keyPEM, _ := SelfSigned()
	cert, _ := tls.X509KeyPair(certPEM, keyPEM)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	g, err := New(Config{Listen: "127.0.0.1:0", HubURL: eh.ln.Addr().String(), Secret: secret,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}, IdleTimeout: 200 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(); err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	_, key, _ := ed25519.GenerateKey(nil)
	c, _, err := dial(t, g, pool, wire.SignUpgrade(key, "GET", "127.0.0.1", wire.WorkerPath, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, err := c.Read(ctx); err == nil || ctx.Err() != nil {
		t.Fatalf("silent connection not closed: %v", err)
	}
	// The splice's idle clock starts when the gateway begins reading,
	// before the client's dial returns: a little under 200 ms is on time.
	if el := time.Since(start); el < 150*time.Millisecond || el > 5*time.Second {
		t.Fatalf("closed after %v, want about the 200ms idle timeout (+2 s grace)", el)
	}
	deadline := time.Now().Add(5 * time.Second)
	for g.Stats().Active != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if a := g.Stats().Active; a != 0 {
		t.Fatalf("%d splices still active", a)
	}
}

// BenchmarkSplice measures echo throughput of 1 MiB messages through the
// gateway (TLS in, plain TCP to the hub): bytes counted both ways.
func BenchmarkSplice(b *testing.B) {
	eh := newEchoHub(b)
	g, pool := newGateway(b, eh.ln.Addr().String(), nil)
	_, key, _ := ed25519.GenerateKey(nil)
	c, _, err := dial(b, g, pool, wire.SignUpgrade(key, "GET", "127.0.0.1", wire.WorkerPath, time.Now()))
	if err != nil {
		b.Fatal(err)
	}
	defer c.CloseNow()
	msg := make([]byte, 1<<20)
	b.SetBytes(2 << 20)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := c.Write(context.Background(), websocket.MessageBinary, msg); err != nil {
			b.Fatal(err)
		}
		if _, _, err := c.Read(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRoundTrip compares a 64-byte echo round trip directly to the hub
// (plain ws) with one through the gateway (wss + splice): the difference is
// the latency the gateway adds.
func BenchmarkRoundTrip(b *testing.B) {
	eh := newEchoHub(b)
	g, pool := newGateway(b, eh.ln.Addr().String(), nil)
	_, key, _ := ed25519.GenerateKey(nil)
	msg := make([]byte, 64)
	run := func(b *testing.B, c *websocket.Conn) {
		for i := 0; i < b.N; i++ {
			if err := c.Write(context.Background(), websocket.MessageBinary, msg); err != nil {
				b.Fatal(err)
			}
			if _, _, err := c.Read(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("direct", func(b *testing.B) {
		h := http.Header{}
		hub.SignGateway(h, secret, "direct", time.Now())
		c, _, err := websocket.Dial(context.Background(), "ws://"+eh.ln.Addr().String()+wire.WorkerPath, &websocket.DialOptions{HTTPHeader: h})
		if err != nil {
			b.Fatal(err)
		}
		defer c.CloseNow()
		b.ResetTimer()
		run(b, c)
	})
	b.Run("gateway", func(b *testing.B) {
		c, _, err := dial(b, g, pool, wire.SignUpgrade(key, "GET", "127.0.0.1", wire.WorkerPath, time.Now()))
		if err != nil {
			b.Fatal(err)
		}
		defer c.CloseNow()
		b.ResetTimer()
		run(b, c)
	})
}

// TestSpliceLargeMessagesExact echoes messages of many sizes, up to 3 MiB,
// through the splice: the client's 4 KiB TLS records are drained and
// written on together, the hub's bytes go back as batched records, and
// every byte arrives in order.
func TestSpliceLargeMessagesExact(t *testing.T) {
	eh := newEchoHub(t)
	g, pool := newGateway(t, eh.ln.Addr().String(), nil)
	_, key, _ := ed25519.GenerateKey(nil)
	c, _, err := dial(t, g, pool, wire.SignUpgrade(key, "GET", "127.0.0.1", wire.WorkerPath, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	sizes := []int{1, 4095, 4096, 16384, 16385, 65536, 256 << 10, 3 << 20, 7}
	msgs := make([][]byte, len(sizes))
	for i, n := range sizes {
		msgs[i] = make([]byte, n)
		for j := range msgs[i] {
			msgs[i][j] = byte(i*31 + j*7 + j>>9)
		}
	}
	errc := make(chan error, 1)
	go func() { // all written before any is read back: the splice holds both directions' bytes at once
		for _, m := range msgs {
			if err := c.Write(context.Background(), websocket.MessageBinary, m); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for i, m := range msgs {
		_, got, err := c.Read(context.Background())
		if err != nil {
			t.Fatalf("message %d (%d bytes): %v", i, len(m), err)
		}
		if string(got) != string(m) {
			t.Fatalf("message %d (%d bytes) came back as %d different bytes", i, len(m), len(got))
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestUpgradeForAnotherHost: a worker's upgrade signature names the host it
// dialled, so headers it made for another gateway (seen by that gateway or
// a proxy in front of it) are refused here: sent as they are (Host: this
// gateway) the signature does not verify, and sent with the other host's
// name as Host the name is not one of this gateway's (its certificate's
// names and Config.Names). Before, such a replay was admitted and a forged
// RESULT got the worker's key banned.
func TestUpgradeForAnotherHost(t *testing.T) {
	eh := newEchoHub(t)
	g, pool := newGateway(t, eh.ln.Addr().String(), nil)
	_, key, _ := ed25519.GenerateKey(nil)
	other := wire.SignUpgrade(key, "GET", "gate-a.example:443", wire.WorkerPath, time.Now())
	if _, resp, err := dial(t, g, pool, other); err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("headers signed for another host: %v %v", resp, err)
	}
	// The same headers with that host's name as Host, over a connection
	// to this gateway.
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, g.Addr())
		},
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"},
	}
	_, port, _ := net.SplitHostPort(g.Addr())
	_, resp, err := websocket.Dial(context.Background(), "wss://gate-a.example:"+port+wire.WorkerPath,
		&websocket.DialOptions{HTTPClient: &http.Client{Transport: tr}, HTTPHeader: wire.SignUpgrade(key, "GET", "gate-a.example", wire.WorkerPath, time.Now())})
	if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("upgrade for another host's name: %v %v", resp, err)
	}
	if body, _ := io.ReadAll(resp.Body); !strings.Contains(string(body), `"gate-a.example" is not a name of this gateway`) {
		t.Fatalf("wrong host's answer %q does not name the host", body)
	}
	var m dto.Metric
	if err := g.met.refused.WithLabelValues("wrong_host").Write(&m); err != nil || m.GetCounter().GetValue() != 1 {
		t.Fatalf("wrong_host refusals %v (%v), want 1", m.GetCounter().GetValue(), err)
	}
	// Headers for this gateway's own name are admitted.
	c, _, err := dial(t, g, pool, wire.SignUpgrade(key, "GET", "127.0.0.1", wire.WorkerPath, time.Now()))
	if err != nil {
		t.Fatalf("own host: %v", err)
	}
	c.CloseNow()
}

// TestOldWorkerTold: a worker signing the version 1 message (no host: a
// worker older than this gateway) is refused with 403 and an answer that
// tells it to update, counted as old_signature; a bad signature is still
// answered with the status text alone.
func TestOldWorkerTold(t *testing.T) {
	eh := newEchoHub(t)
	g, pool := newGateway(t, eh.ln.Addr().String(), nil)
	_, key, _ := ed25519.GenerateKey(nil)
	ms := time.Now().UnixMilli()
	nonce := strings.Repeat("ab", 16)
	// Version 1's message as its docs gave it, written out here.
	v1 := "kvasir-upgrade-v1\nGET\n" + wire.WorkerPath + "\n" + strconv.FormatInt(ms, 10) + "\n" + nonce
	h := http.Header{}
	h.Set(wire.HeaderKey, hex.EncodeToString(key.Public().(ed25519.PublicKey)))
	h.Set(wire.HeaderTime, strconv.FormatInt(ms, 10))
	h.Set(wire.HeaderNonce, nonce)
	h.Set(wire.HeaderSig, hex.EncodeToString(ed25519.Sign(key, []byte(v1))))
	_, resp, err := dial(t, g, pool, h)
	if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("v1 signature: %v %v", resp, err)
	}
	if body, _ := io.ReadAll(resp.Body); !strings.Contains(string(body), "update kvasir") {
		t.Fatalf("old worker's answer %q does not say to update", body)
	}
	var m dto.Metric
	if err := g.met.refused.WithLabelValues("old_signature").Write(&m); err != nil || m.GetCounter().GetValue() != 1 {
		t.Fatalf("old_signature refusals %v (%v), want 1", m.GetCounter().GetValue(), err)
	}
	// A signature by another key is a bad one, and says nothing more.
	_, other, _ := ed25519.GenerateKey(nil)
	h.Set(wire.HeaderSig, hex.EncodeToString(ed25519.Sign(other, []byte(v1))))
	_, resp, err = dial(t, g, pool, h)
	if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("bad signature: %v %v", resp, err)
	}
	if body, _ := io.ReadAll(resp.Body); strings.TrimSpace(string(body)) != "Forbidden" {
		t.Fatalf("bad signature's answer %q", body)
	}
}
