package worker

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// scale computes out = x * (e+1) exactly (small integers times floats).
type scale struct{ d int }

func (s scale) ComputeExperts(ctx context.Context, layer int, hidden []float32, ids []int32, n, k int, out []float32) error {
	for r := 0; r < n; r++ {
		for j := 0; j < k; j++ {
			for i := 0; i < s.d; i++ {
				out[(r*k+j)*s.d+i] = hidden[r*s.d+i] * float32(ids[r*k+j]+1)
			}
		}
	}
	return nil
}

func TestKeyFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sub", "worker.key")
	k1, err := LoadOrCreateKeyFile(p)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(p)
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", st.Mode().Perm())
	}
	k2, err := LoadOrCreateKeyFile(p)
	if err != nil || !k1.Equal(k2) {
		t.Fatalf("reload: %v", err)
	}
	b, _ := os.ReadFile(p)
	if strings.TrimSpace(string(b)) != fmt.Sprintf("%x", k1.Seed()) {
		t.Fatal("file is not the hex seed")
	}
	_ = os.Chmod(p, 0o644)
	if _, err := LoadOrCreateKeyFile(p); !errors.Is(err, ErrKeyFile) {
		t.Fatalf("world-readable key accepted: %v", err)
	}
	_ = os.WriteFile(p, []byte("zz\n"), 0o600)
	_ = os.Chmod(p, 0o600)
	if _, err := LoadOrCreateKeyFile(p); !errors.Is(err, ErrKeyFile) {
		t.Fatalf("garbage key accepted: %v", err)
	}
}

// TestBackoff: against an endpoint that drops every connection, the worker
// keeps redialing with delays bounded by BackoffMax, reports why, and stops
// when its context ends.
func TestBackoff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var dials atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			dials.Add(1)
			c.Close()
		}
	}()
	_, key, _ := ed25519.GenerateKey(nil)
	w, err := New(Config{GatewayURL: "ws://" + ln.Addr().String(), Key: key, Computer: scale{4}, Logger: quiet,
		BackoffBase: 5 * time.Millisecond, BackoffMax: 40 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.Run(ctx) }()
	time.Sleep(600 * time.Millisecond)
	st := w.Stats()
	// Delays average <= 20 ms after the first few, so 600 ms gives well over 10.
	if n := dials.Load(); n < 10 {
		t.Fatalf("%d dials in 600 ms with a 40 ms cap", n)
	}
	if st.State != StateDialing || !strings.Contains(st.LastError, "dial") || st.Reason == "" {
		t.Fatalf("stats %+v", st)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not stop")
	}
	if w.Stats().State != StateOffline {
		t.Fatalf("state %v after stop", w.Stats().State)
	}
}

// TestServe drives a worker from a hand-written backbone over TLS: unheld
// experts get ERROR code 3, a DISPATCH gets the RESULT of exactly its
// requested slots, in (row, slot) order, a DISPATCH_DIGEST the DIGEST of
// the same RESULT, a DISPATCH_SUM each row's weighted sum, and OnServed
// sees the sizes (a DIGEST's and a sum's: the RESULT they stand for).
func TestServe(t *testing.T) {
	const d = 3
	got := make(chan error, 1)
	release := make(chan struct{})
	srv := httptest.NewTLSServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if _, _, err := wire.VerifyUpgrade(r.Header, r.Method, r.Host, r.URL.Path, time.Now(), time.Minute); err != nil {
			http.Error(rw, err.Error(), http.StatusUnauthorized)
			return
		}
		c, err := websocket.Accept(rw, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		got <- func() error {
			ctx := context.Background()
			lim := &wire.Limits{D: d, K: 2, NLayer: 2, NExpert: 4}
			_, msg, err := c.Read(ctx)
			if err != nil {
				return err
			}
			f, err := wire.Decode(msg, lim)
			if err != nil {
				return err
			}
			if h := f.(*wire.Hello); len(h.Holdings) != 2 || h.ModelID != "m" {
				return fmt.Errorf("hello %+v", h)
			}
			send := func(f wire.Frame) error { return c.Write(ctx, websocket.MessageBinary, f.Append(nil)) }
			// The worker pings right after WELCOME; the reads below skip PINGs.
			read := func() ([]byte, error) { return readSkipPing(ctx, c) }
			if err := send(&wire.Welcome{Session: "s1", D: d, K: 2, NLayer: 2, NExpert: 4, Accepted: 2}); err != nil {
				return err
			}
			// Expert 2 of layer 1 is not held.
			if err := send(&wire.Dispatch{Request: 7, Layer: 1, N: 1, D: d, K: 2, Hidden: []float32{1, 2, 3}, IDs: []int32{2, -1}}); err != nil {
				return err
			}
			msg, _ = read()
			if f, err := wire.Decode(msg, lim); err != nil || f.(*wire.Error).Code != wire.CodeNotHeld || f.(*wire.Error).Request != 7 {
				return fmt.Errorf("want ERROR not-held for 7, got %v %v", f, err)
			}
			// Rows: r0 slots (1, 3) both held; r1 only slot 1 (expert 3) is ours.
			disp := &wire.Dispatch{Request: 8, Layer: 1, N: 2, D: d, K: 2,
				Hidden: []float32{1, 2, 3, -0.5, 0.25, 8}, IDs: []int32{1, 3, -1, 3}}
			if err := send(disp); err != nil {
				return err
			}
			msg, _ = read()
			f, err = wire.Decode(msg, lim)
			if err != nil {
				return err
			}
			res := f.(*wire.Result)
			want := []float32{2, 4, 6, 4, 8, 12, -2, 1, 32} // (r0,e1)x2, (r0,e3)x4, (r1,e3)x4
			if res.Request != 8 || res.M != 3 {
				return fmt.Errorf("result %+v", res)
			}
			for i := range want {
				if math.Float32bits(res.Out[i]) != math.Float32bits(want[i]) {
					return fmt.Errorf("out[%d] = %v, want %v", i, res.Out[i], want[i])
				}
			}
			// The same request as a DISPATCH_DIGEST (protocol 4): a DIGEST
			// of the same RESULT payload.
			sum := wire.ResultDigest(msg)
			disp.Request, disp.Digest = 9, true
			if err := send(disp); err != nil {
				return err
			}
			msg, _ = read()
			if f, err = wire.Decode(msg, lim); err != nil {
				return err
			}
			if g, ok := f.(*wire.Digest); !ok || g.Request != 9 || g.M != 3 || g.D != d || g.Sum != sum || len(msg) != wire.DigestSize {
				return fmt.Errorf("digest %+v, want sum %x", f, sum)
			}
			// A DISPATCH_SUM (protocol 6): one row per row, the weighted
			// sum of its slots: r0 0.5*(1,2,3)*2 + 0.25*(1,2,3)*4 =
			// (2,4,6); r1 1*(-0.5,0.25,8)*4 + 0.5*(-0.5,0.25,8)*2 =
			// (-2.5,1.25,40) (exact in float32).
			ds := &wire.Dispatch{Request: 10, Layer: 1, N: 2, D: d, K: 2, Hidden: disp.Hidden,
				IDs: []int32{1, 3, 3, 1}, Sum: true, Weights: []float32{0.5, 0.25, 1, 0.5}}
			if err := send(ds); err != nil {
				return err
			}
			msg, _ = read()
			if f, err = wire.Decode(msg, lim); err != nil {
				return err
			}
			res = f.(*wire.Result)
			want = []float32{2, 4, 6, -2.5, 1.25, 40}
			if res.Request != 10 || res.M != 2 {
				return fmt.Errorf("sum result %+v", res)
			}
			for i := range want {
				if math.Float32bits(res.Out[i]) != math.Float32bits(want[i]) {
					return fmt.Errorf("sum out[%d] = %v, want %v", i, res.Out[i], want[i])
				}
			}
			// The same sums as a DISPATCH_SUM_DIGEST (protocol 7): a DIGEST
			// of 2 rows, of the sum RESULT's payload.
			sum = wire.ResultDigest(msg)
			ds.Request, ds.Digest = 11, true
			if err := send(ds); err != nil {
				return err
			}
			msg, _ = read()
			if f, err = wire.Decode(msg, lim); err != nil {
				return err
			}
			if g, ok := f.(*wire.Digest); !ok || g.Request != 11 || g.M != 2 || g.D != d || g.Sum != sum || len(msg) != wire.DigestSize {
				return fmt.Errorf("sum digest %+v, want sum %x", f, sum)
			}
			return nil
		}()
		<-release
	}))
	defer srv.Close()
	defer close(release)
	pool := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	_, key, _ := ed25519.GenerateKey(nil)
	var served atomic.Value
	w, err := New(Config{GatewayURL: "wss" + strings.TrimPrefix(srv.URL, "https"), Key: key, RootCAs: pool,
		Computer: scale{d}, ModelID: "m", Logger: quiet,
		Holdings: []wire.Holding{{Layer: 1, Expert: 1}, {Layer: 1, Expert: 3}},
		OnServed: func(s string, in, out uint64) { served.Store([3]any{s, in, out}) }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(ctx)
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exchange")
	}
	// The last request, a DISPATCH_SUM_DIGEST: its DIGEST of 2 rows counts
	// as the RESULT of its 4 outputs, as the hub meters it.
	want := [3]any{"s1", uint64(wire.DispatchSumSize(2, d, 2)), uint64(wire.ResultSize(4, d))}
	for i := 0; i < 2500 && served.Load() != want; i++ { // OnServed runs after the send
		time.Sleep(2 * time.Millisecond)
	}
	if v := served.Load(); v != want {
		t.Fatalf("OnServed %v, want %v", v, want)
	}
	// The worker counts a request after sending its answer: wait for the
	// last one's count (the test saw its answer first; slow under qemu).
	st := w.Stats()
	for i := 0; i < 2500 && (st.Rows != 8 || st.Requests != 4); i++ {
		time.Sleep(2 * time.Millisecond)
		st = w.Stats()
	}
	if st.Rows != 8 || st.Requests != 4 || st.Session != "s1" {
		t.Fatalf("stats %+v", st)
	}
}
