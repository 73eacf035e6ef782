package worker

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/coder/websocket"
)

// TestDialBatchesMessages: over wss:// and ws:// the worker's connection
// comes with its batching layer (wire.BatchConn, the one a session's send
// brackets each message with), and a message sent through it arrives
// whole: 256 KiB written in a batch, as a RESULT is.
func TestDialBatchesMessages(t *testing.T) {
	for _, tlsOn := range []bool{true, false} {
		got := make(chan []byte, 1)
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			c, err := websocket.Accept(rw, r, nil)
			if err != nil {
				return
			}
			defer c.CloseNow()
			c.SetReadLimit(1 << 20)
			_, b, err := c.Read(context.Background())
			if err != nil {
				b = nil
			}
			got <- b
		}))
		srv.Config.ErrorLog = log.New(io.Discard, "", 0)
		var cfg Config
		if tlsOn {
			srv.StartTLS()
			pool := x509.NewCertPool()
			pool.AddCert(srv.Certificate())
			cfg.GatewayURL, cfg.RootCAs = "wss"+strings.TrimPrefix(srv.URL, "https"), pool
		} else {
			srv.Start()
			cfg.GatewayURL = "ws" + strings.TrimPrefix(srv.URL, "http")
		}
		_, key, _ := ed25519.GenerateKey(nil)
		cfg.Key, cfg.Computer, cfg.Logger = key, scale{4}, quiet
		w, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		c, bc, err := w.dial(context.Background())
		if err != nil {
			t.Fatalf("tls %v: %v", tlsOn, err)
		}
		if bc == nil {
			t.Fatalf("tls %v: the connection has no batching layer", tlsOn)
		}
		s := &workerSession{w: w, c: c, bc: bc, cctx: context.Background()}
		msg := make([]byte, 256<<10)
		for i := range msg {
			msg[i] = byte(i * 13)
		}
		if err := s.send(msg); err != nil {
			t.Fatal(err)
		}
		if b := <-got; string(b) != string(msg) {
			t.Fatalf("tls %v: the server read %d bytes, not the message", tlsOn, len(b))
		}
		c.CloseNow()
		srv.Close()
	}
}
