package hub

import (
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/engine/wire"
)

// meterStep is one simulated RESULT of a session at a fake time: the
// RESULT arrives and its bytes are metered as creditable at once.
func meterStep(s *session, now time.Time, bytes uint64) {
	s.nResult++
	s.lastResult = now
	s.creditIn += bytes
	s.addUnsettledLocked(now, 0, bytes)
}

// TestSettleSteadyWorkClock: a session that meters a RESULT every 10 ms
// without pause has its bytes settled SettleDelay (+ the merge period)
// after they were metered, while it keeps working. Before the fix the open
// bucket took the time of its newest bytes and never settled.
func TestSettleSteadyWorkClock(t *testing.T) {
	const delay, merge, results = 30 * time.Second, time.Second, 128
	t0 := time.Unix(1_000_000, 0)
	s := &session{merge: merge, lastResult: t0}
	var metered []time.Time // when each RESULT's 100 bytes were metered
	next := t0
	for flush := t0.Add(time.Second); flush.Before(t0.Add(120 * time.Second)); flush = flush.Add(time.Second) {
		for ; next.Before(flush); next = next.Add(10 * time.Millisecond) {
			meterStep(s, next, 100)
			metered = append(metered, next)
		}
		s.settleLocked(flush, delay, results, false)
		// Every byte metered at least delay + merge ago is settled; none
		// metered less than delay ago is.
		var old, young uint64
		for i, at := range metered {
			age := flush.Sub(at)
			if age >= delay+merge && s.nResult-uint64(i+1) >= results {
				old += 100
			}
			if age < delay {
				young += 100
			}
		}
		if s.settled.in < old {
			t.Fatalf("at +%v: settled %d bytes, want at least the %d metered >= %v ago", flush.Sub(t0), s.settled.in, old, delay+merge)
		}
		if s.settled.in > s.creditIn-young {
			t.Fatalf("at +%v: settled %d bytes, more than the %d metered >= %v ago", flush.Sub(t0), s.settled.in, s.creditIn-young, delay)
		}
	}
	if s.settled.in == 0 {
		t.Fatal("nothing settled under steady work")
	}
}

// TestSettleIdleClock: a session that stops receiving RESULTs (paused, or
// no requests) has its held bytes settled once they are SettleDelay old
// and no RESULT came for SettleDelay, without waiting for SettleResults
// more RESULTs; while RESULTs keep coming the count rule holds.
func TestSettleIdleClock(t *testing.T) {
	const delay, merge, results = 30 * time.Second, time.Second, 128
	t0 := time.Unix(1_000_000, 0)
	s := &session{merge: merge, lastResult: t0}
	for i := range 10 {
		meterStep(s, t0.Add(time.Duration(i)*100*time.Millisecond), 100)
	}
	last := t0.Add(900 * time.Millisecond)
	s.settleLocked(last.Add(delay-time.Millisecond), delay, results, false)
	if s.settled.in != 0 {
		t.Fatalf("settled %d bytes before the session was idle for the delay", s.settled.in)
	}
	s.settleLocked(last.Add(delay), delay, results, false)
	if s.settled.in != 1000 || len(s.unsettled) != 0 {
		t.Fatalf("idle for the delay: settled %d of 1000 bytes, %d buckets held", s.settled.in, len(s.unsettled))
	}

	// A worker that keeps answering slowly (one RESULT every 20 s < delay)
	// still needs the count: its bytes stay held.
	s = &session{merge: merge, lastResult: t0}
	for i := range 10 {
		meterStep(s, t0.Add(time.Duration(i)*20*time.Second), 100)
		s.settleLocked(t0.Add(time.Duration(i)*20*time.Second+time.Second), delay, results, false)
	}
	if s.settled.in != 0 {
		t.Fatalf("a working session with %d RESULTs settled %d bytes", s.nResult, s.settled.in)
	}
}

// TestSettleDefaultsSteadyWork runs the hub on the hub command's defaults
// (SettleDelay 30 s, SettleResults 128, FlushEvery 1 s) with a worker kept
// busy (a DISPATCH, RESULT and verdict every ~10 ms): creditable bytes
// reach the ledger within SettleDelay + 5 s of the start, while the worker
// is still working.
func TestSettleDefaultsSteadyWork(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the 30 s default settle delay")
	}
	t.Parallel()
	r := newRig(t, func(c *Config) {
		c.SettleDelay, c.SettleResults, c.FlushEvery = DefaultSettleDelay, DefaultSettleResults, 0
	})
	start := time.Now()
	for req := uint64(1); ; req++ {
		r.toWorker(t, dispatch(req))
		r.toBackbone(t, result(req))
		r.send(t, wire.LinkAccepted, wire.AppendLinkRequest(nil, req))
		if req%50 == 0 {
			if in, out, _, _ := r.ledgerSums(t); in > 0 && out > 0 {
				el := time.Since(start)
				t.Logf("first credit %v after the start, %d results served; ledger in %d out %d", el.Round(time.Millisecond), req, in, out)
				if el < DefaultSettleDelay {
					t.Fatalf("credited after %v, before the settle delay", el)
				}
				return
			}
		}
		if time.Since(start) > DefaultSettleDelay+5*time.Second {
			t.Fatalf("nothing credited %v after the start of steady work (%d results)", time.Since(start), req)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSettleDefaultsIdle: on the hub command's defaults, a session that
// served fewer than SettleResults results and then went quiet (connected,
// no requests) is credited SettleDelay after its last RESULT, not at the
// session's end.
func TestSettleDefaultsIdle(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the 30 s default settle delay")
	}
	t.Parallel()
	r := newRig(t, func(c *Config) {
		c.SettleDelay, c.SettleResults, c.FlushEvery = DefaultSettleDelay, DefaultSettleResults, 0
	})
	for req := uint64(1); req <= 20; req++ {
		r.toWorker(t, dispatch(req))
		r.toBackbone(t, result(req))
		r.send(t, wire.LinkAccepted, wire.AppendLinkRequest(nil, req))
	}
	last := time.Now()
	deadline := last.Add(DefaultSettleDelay + 5*time.Second)
	for {
		in, out, _, _ := r.ledgerSums(t)
		if in == 20*40 && out == 20*44 {
			el := time.Since(last)
			t.Logf("credited %v after the last RESULT", el.Round(time.Millisecond))
			if el < DefaultSettleDelay-time.Second {
				t.Fatalf("credited %v after the last RESULT, before the settle delay", el)
			}
			if s := r.session(t); s.Ended || s.Unsettled != 0 {
				t.Fatalf("session %+v", s)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ledger in %d out %d %v after the last RESULT, want %d and %d", in, out, time.Since(last), 20*40, 20*44)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
