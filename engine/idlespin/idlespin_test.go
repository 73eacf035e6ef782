package idlespin

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"
)

// startForTest starts the spinners (100 ms per hold) or skips where this
// build has none.
func startForTest(t testing.TB) {
	t.Helper()
	err := Start(runtime.GOMAXPROCS(0), 100*time.Millisecond)
	if errors.Is(err, ErrUnsupported) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond every millisecond for up to 10 s (a SCHED_IDLE thread
// on a loaded machine runs only when a CPU has nothing else to do).
func waitFor(t *testing.T, what string, cond func(Stats) bool) Stats {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		st := Read()
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s (%+v)", what, st)
		}
	}
}

func TestStartRejectsBadArguments(t *testing.T) {
	for _, c := range []struct {
		n   int
		max time.Duration
	}{{0, time.Second}, {-1, time.Second}, {1, 0}, {1, -time.Millisecond}} {
		if err := Start(c.n, c.max); err == nil || errors.Is(err, ErrUnsupported) {
			t.Errorf("Start(%d, %v) = %v, want an argument error", c.n, c.max, err)
		}
	}
}

// TestHoldSpinsUntilReleased: a hold sets threads spinning (they use CPU);
// its release puts every one back to sleep, and the CPU count then stops.
func TestHoldSpinsUntilReleased(t *testing.T) {
	startForTest(t)
	st0 := Read()
	if st0.Threads < 1 || st0.Threads > runtime.NumCPU() || st0.Max != 100*time.Millisecond {
		t.Fatalf("after Start: %+v", st0)
	}
	release := Hold()
	waitFor(t, "a spinner spinning", func(s Stats) bool { return s.Spinning > 0 })
	time.Sleep(20 * time.Millisecond)
	release()
	st := waitFor(t, "every spinner asleep", func(s Stats) bool { return s.Spinning == 0 && s.Spins > st0.Spins })
	if st.Holds != st0.Holds+1 || st.CPU <= st0.CPU {
		t.Errorf("one hold: holds %d -> %d, CPU %v -> %v", st0.Holds, st.Holds, st0.CPU, st.CPU)
	}
	time.Sleep(50 * time.Millisecond)
	if again := Read(); again.CPU != st.CPU || again.Spins != st.Spins || again.Spinning != 0 {
		t.Errorf("released spinners still ran: %+v then %+v", st, again)
	}
}

// TestHoldIsBounded: a hold never released stops the spinning after Start's
// max (100 ms), and a new hold starts it again.
func TestHoldIsBounded(t *testing.T) {
	startForTest(t)
	st0 := Read()
	t0 := time.Now() // before the hold: its maximum counts from inside Hold
	release := Hold()
	defer release()
	waitFor(t, "a spinner spinning", func(s Stats) bool { return s.Spinning > 0 })
	st := waitFor(t, "spinning to stop at the maximum", func(s Stats) bool { return s.Spinning == 0 && s.Spins > st0.Spins })
	if el := time.Since(t0); el < 100*time.Millisecond {
		t.Errorf("spinning stopped after %v, before the 100 ms maximum, while held", el)
	}
	second := Hold()
	defer second()
	waitFor(t, "a new hold to wake the spinners", func(s Stats) bool { return s.Spinning > 0 || s.Spins > st.Spins })
}

// TestHoldsNest: spinning lasts while any of several overlapping holders
// holds, and stops when the last releases.
func TestHoldsNest(t *testing.T) {
	startForTest(t)
	a, b := Hold(), Hold()
	waitFor(t, "spinning", func(s Stats) bool { return s.Spinning > 0 })
	a()
	time.Sleep(10 * time.Millisecond)
	if s := Read(); s.Spinning == 0 {
		// A spinner may have been preempted between episodes: give it a
		// moment, it must come back while b holds.
		waitFor(t, "spinning while the second holder holds", func(s Stats) bool { return s.Spinning > 0 })
	}
	b()
	waitFor(t, "every spinner asleep after the last release", func(s Stats) bool { return s.Spinning == 0 })
}

// BenchmarkIdleWake measures what the spinners are for: a reader blocked on
// a loopback TCP connection while its peer sleeps 5 ms and then writes one
// byte; wake-us is the median time from the write to the reader's return.
// "sleeping" runs before the spinners start (every CPU may halt in the
// gap), "held" with a hold across each wait.
func BenchmarkIdleWake(b *testing.B) {
	run := func(b *testing.B, hold bool) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		sent := make(chan time.Time, 1)
		go func() {
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				return
			}
			defer c.Close()
			for {
				time.Sleep(5 * time.Millisecond)
				sent <- time.Now()
				if _, err := c.Write([]byte{1}); err != nil {
					return
				}
			}
		}()
		c, err := ln.Accept()
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		lat := make([]time.Duration, 0, b.N)
		buf := make([]byte, 1)
		b.ResetTimer()
		for range b.N {
			release := noop
			if hold {
				release = Hold()
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(<-sent))
			release()
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		b.ReportMetric(float64(lat[len(lat)/2])/1e3, "wake-us")
	}
	b.Run("sleeping", func(b *testing.B) { run(b, false) })
	b.Run("held", func(b *testing.B) {
		startForTest(b)
		run(b, true)
	})
}

// TestSpinnersAreIdlePriority: every spinner thread runs at SCHED_IDLE
// (policy 5 in field 41 of /proc/self/task/TID/stat, proc(5)), so that it
// never takes CPU time from a thread with work.
func TestSpinnersAreIdlePriority(t *testing.T) {
	startForTest(t)
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Skip(err)
	}
	idle := 0
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + task.Name() + "/stat")
		if err != nil {
			continue // the thread ended
		}
		// Fields after the command name, which is in parentheses and
		// may hold spaces: field 3 is the first of them.
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) < 39 {
			t.Fatalf("stat of task %s: %q", task.Name(), s)
		}
		if fields[41-3] == "5" { // SCHED_IDLE
			idle++
		}
	}
	if st := Read(); idle != st.Threads {
		t.Fatalf("%d threads at SCHED_IDLE, %d spinners", idle, st.Threads)
	}
}
