package worker

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/kvasir-ai/kvasir/engine/idlespin"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// TestSpinBetweenRequests (issue 19): a worker with SpinWait holds the
// idle spinners after each answer while nothing is queued (one hold per
// answer; spinning seen while it waits for the next request), and lets
// them go when its session ends, long before the 10 s maximum.
func TestSpinBetweenRequests(t *testing.T) {
	// The first Start sets the spinners' maximum for the process: 10 s
	// here (New's own Start changes nothing), so that only a release can
	// stop them within the test.
	if err := idlespin.Start(runtime.GOMAXPROCS(0), 10*time.Second); errors.Is(err, idlespin.ErrUnsupported) {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
	const d = 3
	const answers = 5
	before := idlespin.Read()
	done := make(chan error, 1)
	var conns atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if conns.Add(1) > 1 {
			// One session only: a reconnect would serve more answers
			// and hold the spinners more times (CI once saw 8 holds).
			http.Error(rw, "one session only", http.StatusServiceUnavailable)
			return
		}
		c, err := websocket.Accept(rw, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		defer func() {
			// The session stays open until the worker closes it.
			for {
				if _, _, err := c.Read(context.Background()); err != nil {
					return
				}
			}
		}()
		done <- func() error {
			ctx := context.Background()
			lim := &wire.Limits{D: d, K: 2, NLayer: 2, NExpert: 4}
			if _, _, err := c.Read(ctx); err != nil { // HELLO
				return err
			}
			send := func(f wire.Frame) error { return c.Write(ctx, websocket.MessageBinary, f.Append(nil)) }
			if err := send(&wire.Welcome{Session: "s1", D: d, K: 2, NLayer: 2, NExpert: 4, Accepted: 2}); err != nil {
				return err
			}
			for i := range answers {
				if err := send(&wire.Dispatch{Request: uint64(10 + i), Layer: 1, N: 1, D: d, K: 2,
					Hidden: []float32{1, 2, 3}, IDs: []int32{1, 3}}); err != nil {
					return err
				}
				msg, err := readSkipPing(ctx, c)
				if err != nil {
					return err
				}
				if f, err := wire.Decode(msg, lim); err != nil || f.(*wire.Result).Request != uint64(10+i) {
					return fmt.Errorf("answer %d: %v %v", i, f, err)
				}
				// The next request goes once this answer's hold is
				// taken: one sent earlier may be queued before the
				// worker looks, and then (rightly) no hold is taken.
				for t0 := time.Now(); idlespin.Read().Holds < before.Holds+uint64(i+1); {
					if time.Since(t0) > 10*time.Second {
						return fmt.Errorf("answer %d: no hold taken in 10 s", i)
					}
					time.Sleep(time.Millisecond)
				}
			}
			return nil
		}()
	}))
	defer srv.Close()
	pool := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	_, key, _ := ed25519.GenerateKey(nil)
	w, err := New(Config{GatewayURL: "wss" + strings.TrimPrefix(srv.URL, "https"), Key: key, RootCAs: pool,
		Computer: scale{d}, ModelID: "m", Logger: quiet, SpinWait: 10 * time.Second,
		Holdings: []wire.Holding{{Layer: 1, Expert: 1}, {Layer: 1, Expert: 3}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); _ = w.Run(ctx) }()
	defer func() { cancel(); <-ran }() // a failed test leaves no hold behind
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no exchange")
	}
	deadline := time.Now().Add(10 * time.Second)
	for idlespin.Read().Holds < before.Holds+answers && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := idlespin.Read().Holds - before.Holds; got != answers {
		t.Fatalf("%d holds for %d answers", got, answers)
	}
	// The last answer's hold lasts until the next request or the end.
	for idlespin.Read().Spinning == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no spinner spinning while the worker waits for a request")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-ran
	t0 := time.Now()
	for idlespin.Read().Spinning > 0 {
		if time.Since(t0) > 5*time.Second {
			t.Fatal("spinners still spinning 5 s after the session ended")
		}
		time.Sleep(time.Millisecond)
	}
	if st := w.Stats(); st.SpinCPU <= before.CPU {
		t.Fatalf("SpinCPU %v, %v before", st.SpinCPU, before.CPU)
	}
}
