package worker

import (
	"context"
	"crypto/ed25519"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// readSkipPing reads the next worker message that is not a PING, answering
// PINGs with PONG.
func readSkipPing(ctx context.Context, c *websocket.Conn) ([]byte, error) {
	for {
		_, msg, err := c.Read(ctx)
		if err != nil {
			return nil, err
		}
		if t, err := wire.Peek(msg); err == nil && t == wire.TypePing {
			f, err := wire.Decode(msg, nil)
			if err != nil {
				return nil, err
			}
			if err := c.Write(ctx, websocket.MessageBinary, (&wire.Pong{Time: f.(*wire.Ping).Time}).Append(nil)); err != nil {
				return nil, err
			}
			continue
		}
		return msg, nil
	}
}

// runWorker starts w.Run and stops it at cleanup.
func runWorker(t *testing.T, cfg Config) *Worker {
	t.Helper()
	_, key, _ := ed25519.GenerateKey(nil)
	cfg.Key, cfg.Computer, cfg.Logger = key, scale{4}, quiet
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

// TestRefusedIsPermanent: a backbone that refuses the HELLO (a 1008 close
// before WELCOME, as backbone/dispatch does for another model) is reported
// with its reason and retried only after BackoffMax, not every BackoffBase.
func TestRefusedIsPermanent(t *testing.T) {
	const reason = `model id "other@00" does not match the backbone's "tiny@11"`
	var dials atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		dials.Add(1)
		c, err := websocket.Accept(rw, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		if _, _, err := c.Read(r.Context()); err != nil { // HELLO
			return
		}
		c.Close(websocket.StatusPolicyViolation, reason)
	}))
	defer srv.Close()
	const maxDelay = 700 * time.Millisecond
	w := runWorker(t, Config{GatewayURL: "ws" + strings.TrimPrefix(srv.URL, "http"),
		BackoffBase: 5 * time.Millisecond, BackoffMax: maxDelay})
	time.Sleep(maxDelay / 2)
	st := w.Stats()
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d dials within BackoffMax/2 of a permanent refusal, want 1", n)
	}
	if !strings.Contains(st.LastError, reason) || !strings.Contains(st.LastError, "refused") ||
		!strings.Contains(st.Reason, "refused: ") || st.State != StateDialing {
		t.Fatalf("stats: state %v reason %q last error %q", st.State, st.Reason, st.LastError)
	}
	time.Sleep(maxDelay)
	if n := dials.Load(); n != 2 {
		t.Fatalf("%d dials after 1.5 x BackoffMax, want 2 (one retry at BackoffMax)", n)
	}
}

// TestBackoffNotResetByFastFailures: a gateway answering 503 (the backbone
// down) after 30 ms must not reset the backoff even with StableAfter below
// 30 ms: only a session that got WELCOME counts. With the old reset (on
// session length alone) this dialed every ~35 ms (~40 dials in 1.5 s).
func TestBackoffNotResetByFastFailures(t *testing.T) {
	var dials atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		dials.Add(1)
		time.Sleep(30 * time.Millisecond)
		http.Error(rw, "backbone unreachable", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	w := runWorker(t, Config{GatewayURL: "ws" + strings.TrimPrefix(srv.URL, "http"),
		BackoffBase: 10 * time.Millisecond, BackoffMax: 2 * time.Second, StableAfter: 20 * time.Millisecond})
	time.Sleep(1500 * time.Millisecond)
	// Bounds 10, 20, 40, ... ms: the expected time of the first 12 dials
	// is > 12 x 30 ms + (10+20+...+2000)/2 ms > 2 s.
	if n := dials.Load(); n < 2 || n > 20 {
		t.Fatalf("%d dials in 1.5 s", n)
	}
	st := w.Stats()
	if !strings.Contains(st.LastError, "503") || !strings.Contains(st.LastError, "backbone unreachable") {
		t.Fatalf("last error %q", st.LastError)
	}
	if strings.Contains(st.Reason, "refused: ") {
		t.Fatalf("503 reported as permanent: %q", st.Reason)
	}
}

// TestUnknownAuthorityHint: a gateway certificate the worker does not trust
// gives an error that says to pass --ca, and is not retried fast.
func TestUnknownAuthorityHint(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.NotFoundHandler())
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake
	srv.StartTLS()
	defer srv.Close()
	w := runWorker(t, Config{GatewayURL: "wss" + strings.TrimPrefix(srv.URL, "https"),
		BackoffBase: 5 * time.Millisecond, BackoffMax: time.Minute})
	var st Stats
	for i := 0; i < 200; i++ {
		if st = w.Stats(); st.LastError != "" {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(st.LastError, "pass --ca FILE with the gateway's certificate (or its CA)") ||
		!strings.Contains(st.LastError, "x509") || !strings.Contains(st.Reason, "refused: ") {
		t.Fatalf("state %v reason %q last error %q", st.State, st.Reason, st.LastError)
	}
}

// TestFirstPing: the worker pings right after WELCOME (not only after
// PingInterval), so its RTT is known at once.
func TestFirstPing(t *testing.T) {
	pinged := make(chan time.Duration, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(rw, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		ctx := r.Context()
		if _, _, err := c.Read(ctx); err != nil { // HELLO
			return
		}
		wel := &wire.Welcome{Session: "s", D: 4, K: 1, NLayer: 1, NExpert: 1}
		if err := c.Write(ctx, websocket.MessageBinary, wel.Append(nil)); err != nil {
			return
		}
		start := time.Now()
		_, msg, err := c.Read(ctx)
		if err != nil {
			return
		}
		f, err := wire.Decode(msg, nil)
		if p, ok := f.(*wire.Ping); err == nil && ok {
			pinged <- time.Since(start)
			time.Sleep(5 * time.Millisecond) // a measurable round trip
			_ = c.Write(ctx, websocket.MessageBinary, (&wire.Pong{Time: p.Time}).Append(nil))
		}
		_, _, _ = c.Read(ctx) // until the worker goes
	}))
	defer srv.Close()
	w := runWorker(t, Config{GatewayURL: "ws" + strings.TrimPrefix(srv.URL, "http"), PingInterval: time.Hour})
	select {
	case d := <-pinged:
		t.Logf("first PING %v after WELCOME", d)
	case <-time.After(3 * time.Second):
		t.Fatal("no PING within 3 s of WELCOME (PingInterval 1 h)")
	}
	for i := 0; i < 200 && w.Stats().RTT == 0; i++ {
		time.Sleep(5 * time.Millisecond)
	}
	if rtt := w.Stats().RTT; rtt < 5*time.Millisecond || rtt > 3*time.Second {
		t.Fatalf("RTT %v, want >= 5 ms (the server's delay)", rtt)
	}
}

// TestOtherVersionIsPermanent: a WELCOME of another protocol version is a
// permanent failure (ErrVersion in LastError, retried after BackoffMax).
func TestOtherVersionIsPermanent(t *testing.T) {
	var dials atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		dials.Add(1)
		c, err := websocket.Accept(rw, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		if _, _, err := c.Read(r.Context()); err != nil { // HELLO
			return
		}
		b := (&wire.Welcome{Session: "s", D: 4, K: 1, NLayer: 1, NExpert: 1}).Append(nil)
		b[1], b[2] = byte(wire.Version+1), byte((wire.Version+1)>>8) // u16 LE after the magic
		_ = c.Write(r.Context(), websocket.MessageBinary, b)
		_, _, _ = c.Read(r.Context())
	}))
	defer srv.Close()
	w := runWorker(t, Config{GatewayURL: "ws" + strings.TrimPrefix(srv.URL, "http"),
		BackoffBase: 5 * time.Millisecond, BackoffMax: time.Minute})
	var st Stats
	for i := 0; i < 200; i++ {
		if st = w.Stats(); st.LastError != "" {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if !strings.Contains(st.LastError, "unsupported protocol version") || !strings.Contains(w.Stats().Reason, "refused: ") || dials.Load() != 1 {
		t.Fatalf("dials %d, reason %q, last error %q", dials.Load(), w.Stats().Reason, st.LastError)
	}
}

// TestOversizedResultRefused: a DISPATCH whose RESULT would exceed
// wire.MaxMessage (from a backbone that does not split its requests) is
// answered with ERROR, not with a frame every reader would cut, and the
// session stays up.
func TestOversizedResultRefused(t *testing.T) {
	const d, k, n = 4, 64, 65536 // m = n*k = 2^22 outputs: RESULT 64 MiB + 20 bytes; DISPATCH 17 MB
	got := make(chan *wire.Error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(rw, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		c.SetReadLimit(wire.MaxMessage)
		ctx := r.Context()
		if _, _, err := c.Read(ctx); err != nil { // HELLO
			return
		}
		wel := &wire.Welcome{Session: "s", D: d, K: k, NLayer: 1, NExpert: k}
		if err := c.Write(ctx, websocket.MessageBinary, wel.Append(nil)); err != nil {
			return
		}
		disp := &wire.Dispatch{Request: 7, N: n, D: d, K: k, Hidden: make([]float32, n*d), IDs: make([]int32, n*k)}
		if err := c.Write(ctx, websocket.MessageBinary, disp.Append(nil)); err != nil {
			return
		}
		msg, err := readSkipPing(ctx, c)
		if err != nil {
			return
		}
		if f, err := wire.Decode(msg, nil); err == nil {
			if e, ok := f.(*wire.Error); ok {
				got <- e
			}
		}
		_, _, _ = c.Read(ctx) // until the worker goes
	}))
	defer srv.Close()
	if wire.ResultSize(n*k, d) <= wire.MaxMessage || wire.DispatchSize(n, d, k) > wire.MaxMessage {
		t.Fatal("shapes do not straddle the limit")
	}
	w := runWorker(t, Config{GatewayURL: "ws" + strings.TrimPrefix(srv.URL, "http"), PingInterval: time.Hour,
		Holdings: []wire.Holding{{Layer: 0, Expert: 0}}})
	select {
	case e := <-got:
		if e.Request != 7 || e.Code != wire.CodeInternal || !strings.Contains(e.Message, "frame limit") {
			t.Fatalf("error %+v", e)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no ERROR for the oversized request")
	}
	if st := w.Stats(); st.State != StateConnected || st.Requests != 0 {
		t.Fatalf("worker %+v", st)
	}
}
