//go:build unix

package worker

import (
	"context"
	"crypto/ed25519"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// burner is an expert.Computer that spins threads goroutines through a
// fixed amount of arithmetic per call (a few ms each on a desktop core),
// then answers out = hidden x (id+1). It records the longest call.
type burner struct {
	d, threads int
	longest    atomic.Int64 // ns
	sink       atomic.Uint64
}

const burnIters = 4_000_000

func spin(n int) uint64 {
	x := uint64(88172645463325252)
	for i := 0; i < n; i++ { // xorshift64: a dependency chain the compiler cannot drop
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
	}
	return x
}

func (b *burner) ComputeExperts(ctx context.Context, layer int, hidden []float32, ids []int32, n, k int, out []float32) error {
	t0 := time.Now()
	var wg sync.WaitGroup
	for range b.threads {
		wg.Go(func() { b.sink.Add(spin(burnIters)) })
	}
	wg.Wait()
	if d := int64(time.Since(t0)); d > b.longest.Load() {
		b.longest.Store(d)
	}
	for r := 0; r < n; r++ {
		for j := 0; j < k; j++ {
			for i := 0; i < b.d; i++ {
				out[(r*k+j)*b.d+i] = hidden[r*b.d+i] * float32(ids[r*k+j]+1)
			}
		}
	}
	return nil
}

// loadBackbone is a hand-written backbone that keeps a worker busy: two
// DISPATCHes in flight whenever the worker is not paused, a new one as
// each RESULT arrives; it honours PAUSE as backbone/dispatch does (no new
// work while paused) and counts what it sees.
type loadBackbone struct {
	d        int
	mu       sync.Mutex
	paused   bool
	inflight int
	kick     chan struct{}

	sessions, results, pauses, resumes, refusals atomic.Int64
}

func (b *loadBackbone) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if _, _, err := wire.VerifyUpgrade(r.Header, r.Method, r.Host, r.URL.Path, time.Now(), time.Minute); err != nil {
		http.Error(rw, err.Error(), http.StatusUnauthorized)
		return
	}
	c, err := websocket.Accept(rw, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	b.sessions.Add(1)
	ctx := r.Context()
	lim := &wire.Limits{D: b.d, K: 1, NLayer: 1, NExpert: 1}
	if _, _, err := c.Read(ctx); err != nil { // HELLO
		return
	}
	if c.Write(ctx, websocket.MessageBinary, (&wire.Welcome{Session: "load", D: uint32(b.d), K: 1, NLayer: 1, NExpert: 1, Accepted: 1}).Append(nil)) != nil {
		return
	}
	go func() {
		for {
			_, msg, err := c.Read(ctx)
			if err != nil {
				return
			}
			f, err := wire.Decode(msg, lim)
			if err != nil {
				continue
			}
			b.mu.Lock()
			switch f := f.(type) {
			case *wire.Result:
				b.inflight--
				b.results.Add(1)
			case *wire.Error:
				b.inflight--
				b.refusals.Add(1)
			case *wire.Pause:
				b.paused = f.Paused
				if f.Paused {
					b.pauses.Add(1)
				} else {
					b.resumes.Add(1)
				}
			}
			b.mu.Unlock()
			select {
			case b.kick <- struct{}{}:
			default:
			}
		}
	}()
	hidden := make([]float32, b.d)
	for i := range hidden {
		hidden[i] = float32(i) + 0.5
	}
	for req := uint64(1); ; {
		b.mu.Lock()
		send := !b.paused && b.inflight < 2
		if send {
			b.inflight++
		}
		b.mu.Unlock()
		if send {
			msg := (&wire.Dispatch{Request: req, Layer: 0, N: 1, D: b.d, K: 1, Hidden: hidden, IDs: []int32{0}}).Append(nil)
			if c.Write(ctx, websocket.MessageBinary, msg) != nil {
				return
			}
			req++
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-b.kick:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// cpuSelf is this process's user + system CPU time, read with getrusage
// here, apart from the worker's own reading.
func cpuSelf(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestCPULimitMeasured runs a worker under steady load (a backbone that
// keeps it busy, a computer that spins every core) at a CPU limit of 50 %,
// 25 % and 10 % (which still bites on a machine other programs keep busy),
// and at the default (no limit), and measures the process's CPU
// time over wall time with getrusage around a window of a few seconds:
// with a limit it stays within the limit plus the documented excess
// (MinRest's share and one request), yet works (well above 0), through one
// session, never shown as paused and never refusing work; without one it
// is not throttled: no PAUSE and as much CPU as the same spinning gets
// with no worker (measured first, since other programs share the machine).
func TestCPULimitMeasured(t *testing.T) {
	if testing.Short() {
		t.Skip("measures CPU time for 16 s; -short leaves it out")
	}
	n := cores
	// What spinning every core gets on this machine now.
	b0 := &burner{d: 4, threads: n}
	c0, t0 := cpuSelf(t), time.Now()
	for time.Since(t0) < time.Second {
		_ = b0.ComputeExperts(context.Background(), 0, make([]float32, 4), []int32{0}, 1, 1, make([]float32, 4))
	}
	avail := (cpuSelf(t) - c0).Seconds() / time.Since(t0).Seconds() / float64(n)
	t.Logf("%d cores; spinning all of them alone gets %.1f%% of the machine", n, 100*avail)

	for _, c := range []struct {
		pct    int
		window time.Duration
	}{{100, 3 * time.Second}, {50, 4 * time.Second}, {25, 4 * time.Second}, {10, 4 * time.Second}} {
		bb := &loadBackbone{d: 4, kick: make(chan struct{}, 1)}
		srv := httptest.NewServer(bb)
		comp := &burner{d: 4, threads: n}
		_, key, _ := ed25519.GenerateKey(nil)
		limit := c.pct
		if limit == 100 {
			limit = 0 // the default: no limit
		}
		w, err := New(Config{GatewayURL: "ws" + strings.TrimPrefix(srv.URL, "http"), Key: key, Computer: comp, Threads: n,
			Holdings: []wire.Holding{{Layer: 0, Expert: 0}}, Logger: quiet, CPULimit: limit})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = w.Run(ctx) }()
		for i := 0; i < 500 && bb.results.Load() < 2; i++ {
			time.Sleep(10 * time.Millisecond)
		}
		if bb.results.Load() < 2 {
			t.Fatalf("%d%%: the worker answered nothing", c.pct)
		}

		res0, cpu0, wall0 := bb.results.Load(), cpuSelf(t), time.Now()
		states := map[State]int{}
		for time.Since(wall0) < c.window {
			time.Sleep(50 * time.Millisecond)
			states[w.Stats().State]++
		}
		cpu, wall := cpuSelf(t)-cpu0, time.Since(wall0)
		results := bb.results.Load() - res0
		st := w.Stats()
		cancel()
		<-done
		srv.Close()

		frac := cpu.Seconds() / wall.Seconds() / float64(n)
		t.Logf("limit %d%%: %.1f%% of the machine (%.2f CPU s in %.2f s), %d results, %d rests (%v rested in all), PAUSE 1 sent %d times, longest request %v",
			c.pct, 100*frac, cpu.Seconds(), wall.Seconds(), results, st.Rests, st.RestTime.Round(time.Millisecond), bb.pauses.Load(),
			time.Duration(comp.longest.Load()).Round(time.Millisecond))
		if bb.sessions.Load() != 1 || bb.refusals.Load() != 0 || states[StatePaused] != 0 || states[StateDialing] != 0 {
			t.Errorf("%d%%: %d sessions, %d refusals, states seen %v; want one session, no refusal, always connected",
				c.pct, bb.sessions.Load(), bb.refusals.Load(), states)
		}
		if c.pct == 100 {
			if bb.pauses.Load() != 0 || st.Rests != 0 || st.CPULimit != 0 {
				t.Errorf("no limit: %d PAUSEs, %d rests, limit %d", bb.pauses.Load(), st.Rests, st.CPULimit)
			}
			// The exact checks are above (no rest, no PAUSE); other
			// programs' load varies between the two measurements, so this
			// one only catches a worker that barely runs.
			if frac < 0.5*avail {
				t.Errorf("no limit: %.1f%% of the machine, want about the %.1f%% spinning alone gets", 100*frac, 100*avail)
			}
			continue
		}
		rate := float64(c.pct) / 100 * float64(n)
		longest := time.Duration(comp.longest.Load()).Seconds() * float64(n)
		bound := rate*(wall.Seconds()+MinRest.Seconds()) + longest + 0.02
		if cpu.Seconds() > bound {
			t.Errorf("limit %d%%: %.3f CPU s in %.3f s = %.1f%% of the machine; the limit allows %.3f (%.1f%%)",
				c.pct, cpu.Seconds(), wall.Seconds(), 100*frac, bound, 100*bound/wall.Seconds()/float64(n))
		}
		if want := min(float64(c.pct)/100, avail) / 3; frac < want || results < 10 {
			t.Errorf("limit %d%%: %.1f%% of the machine and %d results; it should still work (at least %.1f%%)", c.pct, 100*frac, results, 100*want)
		}
		if st.CPULimit != c.pct || bb.resumes.Load() < bb.pauses.Load()-1 || int64(st.Rests) < bb.pauses.Load() {
			t.Errorf("limit %d%%: %d PAUSE 1, %d PAUSE 0, %d rests, limit %d", c.pct, bb.pauses.Load(), bb.resumes.Load(), st.Rests, st.CPULimit)
		}
		// When spinning alone gets well over the limit, the limit is what
		// held the process back: it rested.
		if avail > 1.2*float64(c.pct)/100 && (bb.pauses.Load() == 0 || st.Rests == 0) {
			t.Errorf("limit %d%%: spinning alone gets %.1f%%, yet the worker never rested", c.pct, 100*avail)
		} else if avail <= 1.2*float64(c.pct)/100 {
			t.Logf("limit %d%%: other programs leave this process only %.1f%% of the machine: the limit had little to cut", c.pct, 100*avail)
		}
	}
}
