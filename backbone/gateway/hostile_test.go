package gateway

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// tapConn is a worker's TCP connection under its TLS client whose writes
// can be held back (hold) and then sent in one write with bytes of the
// test's own after them (release): a hostile or broken peer's records
// arrive in the same socket read as good ones.
type tapConn struct {
	net.Conn
	mu   sync.Mutex
	hold bool
	held []byte
}

func (t *tapConn) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.hold {
		t.held = append(t.held, b...)
		return len(b), nil
	}
	return t.Conn.Write(b)
}

// holdWrites makes later writes wait for release.
func (t *tapConn) holdWrites() {
	t.mu.Lock()
	t.hold = true
	t.mu.Unlock()
}

// release writes the held bytes and then raw in one write and stops
// holding.
func (t *tapConn) release(raw []byte) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := append(t.held, raw...)
	t.held, t.hold = nil, false
	_, err := t.Conn.Write(b)
	return err
}

// dialTap is dial with the worker's TCP connection reachable as a tapConn.
func dialTap(t *testing.T, g *Gateway, pool *x509.CertPool) (*websocket.Conn, *tapConn) {
	t.Helper()
	var tap *tapConn
	tr := &http.Transport{DialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		raw, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		host, _, _ := net.SplitHostPort(addr)
		tap = &tapConn{Conn: raw}
		tc := tls.Client(tap, &tls.Config{RootCAs: pool, ServerName: host})
		if err := tc.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, err
		}
		return tc, nil
	}}
	_, key, _ := ed25519.GenerateKey(nil)
	c, _, err := websocket.Dial(context.Background(), "wss://"+g.Addr()+wire.WorkerPath,
		&websocket.DialOptions{HTTPClient: &http.Client{Transport: tr}, HTTPHeader: wire.SignUpgrade(key, "GET", "127.0.0.1", wire.WorkerPath, time.Now())})
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadLimit(wire.MaxMessage)
	t.Cleanup(func() { c.CloseNow() })
	return c, tap
}

// TestSpliceHostileRecords sends, after good messages, TLS records that
// are not good: one that fails authentication (a forged or corrupted
// record) and one cut short by the worker's FIN. Each arrives in the same
// socket read as a good message's records, so the gateway's drain meets
// it. The good message before it reaches the hub whole (nothing the
// worker sent in good faith is lost), the splice ends at once rather than
// at the 90 s idle timeout, counting a read error, and the gateway goes on
// serving other workers. The gateway runs on its defaults.
func TestSpliceHostileRecords(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	msg := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return b
	}
	// A TLS 1.3 application_data record header (type 23, legacy version
	// 0x0303, length), then its body.
	record := func(length int, body []byte) []byte {
		return append([]byte{23, 3, 3, byte(length >> 8), byte(length)}, body...)
	}
	cases := []struct {
		name  string
		raw   []byte // sent right after the good message's records
		close bool   // half-close the worker's TCP connection after raw
	}{
		{name: "forged record", raw: record(200, msg(200))},
		{name: "record cut short", raw: record(1000, msg(10)), close: true},
	}
	eh := newEchoHub(t)
	g, pool := newGateway(t, eh.ln.Addr().String(), nil)
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, tap := dialTap(t, g, pool)
			first := msg(300 << 10)
			if err := c.Write(context.Background(), websocket.MessageBinary, first); err != nil {
				t.Fatal(err)
			}
			if _, got, err := c.Read(context.Background()); err != nil || string(got) != string(first) {
				t.Fatalf("echo of the first message: %d bytes, %v", len(got), err)
			}
			if got := <-eh.got; string(got) != string(first) {
				t.Fatal("the hub got another first message")
			}
			// The good message's records and the bad bytes leave in one
			// write: the gateway's socket read holds both.
			good := msg(100 << 10)
			tap.holdWrites()
			if err := c.Write(context.Background(), websocket.MessageBinary, good); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if err := tap.release(tc.raw); err != nil {
				t.Fatal(err)
			}
			if tc.close {
				if err := tap.Conn.(*net.TCPConn).CloseWrite(); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case got := <-eh.got:
				if string(got) != string(good) {
					t.Fatalf("the hub got %d bytes, not the good message of %d", len(got), len(good))
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the good message before the bad record never reached the hub")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for {
				if _, _, err := c.Read(ctx); err != nil {
					if ctx.Err() != nil {
						t.Fatal("the splice did not end after the bad record")
					}
					break
				}
			}
			if el := time.Since(start); el > 5*time.Second {
				t.Fatalf("the splice ended %v after the bad record (grace is 2 s)", el)
			}
			want := `kvasir_gateway_splice_errors_total{reason="read"} ` + strconv.Itoa(i+1)
			deadline := time.Now().Add(5 * time.Second)
			for !strings.Contains(scrape(t, g), want) && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if m := scrape(t, g); !strings.Contains(m, want) {
				t.Fatalf("splice error not counted (want %s):\n%s", want, m)
			}
			// The gateway goes on serving: a new worker's messages echo.
			c2, _ := dialTap(t, g, pool)
			again := msg(20 << 10)
			if err := c2.Write(context.Background(), websocket.MessageBinary, again); err != nil {
				t.Fatal(err)
			}
			if _, got, err := c2.Read(context.Background()); err != nil || string(got) != string(again) {
				t.Fatalf("a later worker's echo: %d bytes, %v", len(got), err)
			}
			<-eh.got
			c2.Close(websocket.StatusNormalClosure, "")
		})
	}
}
