package dispatch_test

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// TestSwarmBitIdentical: two workers through gateway (TLS) and hub serve
// layers 0-1 and 2-3; every call equals the local reference bit for bit, no
// expert is computed locally, and the hub's metering matches the bytes the
// dispatcher sent and accepted.
func TestSwarmBitIdentical(t *testing.T) {
	m := testModel()
	s := newStack(t, m, 0, nil)
	wa := &fakeExperts{d: m.D, nExpert: m.NExpert, holds: holdsLayers(0, 1)}
	wb := &fakeExperts{d: m.D, nExpert: m.NExpert, holds: holdsLayers(2, 3)}
	s.startWorker(t, wa, 0, 1)
	s.startWorker(t, wb, 2, 3)
	s.waitWorkers(t, 2)
	rng := rand.New(rand.NewPCG(1, 2))
	steps := 0
	for _, n := range []int{1, 3, 17} {
		for l := 0; l < m.NLayer; l++ {
			s.run(t, randomCall(t, m, rng, l, n))
			steps++
		}
	}
	st := s.disp.Stats()
	if st.ExpertsLocal != 0 || st.ExpertsRemote != uint64((1+3+17)*m.K*m.NLayer) {
		t.Fatalf("remote %d local %d, want %d and 0", st.ExpertsRemote, st.ExpertsLocal, (1+3+17)*m.K*m.NLayer)
	}
	if s.local.calls.Load() != 0 || wa.calls.Load() != 6 || wb.calls.Load() != 6 {
		t.Fatalf("calls: local %d a %d b %d, want 0 6 6", s.local.calls.Load(), wa.calls.Load(), wb.calls.Load())
	}
	// Metering: creditable bytes equal the DISPATCH and RESULT sizes the
	// dispatcher accounts for (layouts in engine/wire).
	var wantOut, wantIn uint64
	for _, w := range st.Workers {
		if w.Results != w.Requests || w.Timeouts != 0 {
			t.Fatalf("worker %s: requests %d results %d timeouts %d", w.ID[:8], w.Requests, w.Results, w.Timeouts)
		}
		wantOut += w.Requests*24 + 4*w.Rows*uint64(m.D+m.K)
		wantIn += w.Results*28 + 4*w.Pairs*uint64(m.D)
	}
	gotOut, gotIn, rej, _ := s.hubTotals(t)
	if gotOut != wantOut || gotIn != wantIn || rej != 0 {
		t.Fatalf("hub metered out %d in %d rejected %d; want %d %d 0", gotOut, gotIn, rej, wantOut, wantIn)
	}
}

// TestUnheldComputedLocally: experts no worker holds go to the fallback, the
// rest to the worker, and the numbers do not change.
func TestUnheldComputedLocally(t *testing.T) {
	m := testModel()
	s := newStack(t, m, 0, nil)
	s.startWorker(t, &fakeExperts{d: m.D, nExpert: m.NExpert, holds: holdsLayers(1)}, 1)
	s.waitWorkers(t, 1)
	rng := rand.New(rand.NewPCG(3, 4))
	s.run(t, randomCall(t, m, rng, 0, 5)) // all local
	s.run(t, randomCall(t, m, rng, 1, 5)) // all remote
	st := s.disp.Stats()
	if st.ExpertsLocal != 10 || st.ExpertsRemote != 10 {
		t.Fatalf("local %d remote %d, want 10 10", st.ExpertsLocal, st.ExpertsRemote)
	}
}

// TestWorkerDiesMidStep: a worker whose session drops while it computes (the
// socket closes under it) -> the call finishes with the same numbers, well
// before the deadline.
func TestWorkerDiesMidStep(t *testing.T) {
	m := testModel()
	s := newStack(t, m, 0, func(c *dispatch.Config) { c.MaxDeadline = 5 * time.Second })
	comp := &fakeExperts{d: m.D, nExpert: m.NExpert, block: make(chan struct{})}
	var cancel func()
	comp.onCall = func() { go cancel() } // kill the worker once it has the request
	_, cancel = s.startWorker(t, comp, 0, 1, 2, 3)
	s.waitWorkers(t, 1)
	el := s.run(t, randomCall(t, m, rand.New(rand.NewPCG(5, 6)), 2, 9))
	if el > 2500*time.Millisecond { // half the deadline: a loaded test machine's slack, far from waiting it out
		t.Fatalf("call took %v after the worker died", el)
	}
	st := s.disp.Stats()
	if st.ExpertsLocal != 18 || st.ExpertsRemote != 0 || comp.calls.Load() != 1 {
		t.Fatalf("local %d remote %d worker calls %d", st.ExpertsLocal, st.ExpertsRemote, comp.calls.Load())
	}
}

// TestWorkerHangs: a worker that never answers -> the deadline fires, the
// pairs are recomputed locally, and the late RESULT is dropped, rejected in
// the ledger with its DISPATCH, and does not close the session.
func TestWorkerHangs(t *testing.T) {
	m := testModel()
	const maxDL = 300 * time.Millisecond
	s := newStack(t, m, 0, func(c *dispatch.Config) { c.MaxDeadline = maxDL; c.MinDeadline = 10 * time.Millisecond })
	comp := &fakeExperts{d: m.D, nExpert: m.NExpert, block: make(chan struct{})}
	s.startWorker(t, comp, 0)
	s.waitWorkers(t, 1)
	el := s.run(t, randomCall(t, m, rand.New(rand.NewPCG(7, 8)), 0, 4))
	if el < maxDL || el > maxDL+2*time.Second { // slack for a loaded test machine; the worker never answers
		t.Fatalf("call took %v, want about the %v deadline", el, maxDL)
	}
	close(comp.block) // the worker answers late
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := s.disp.Stats()
		ss := s.hub.Sessions()
		if len(st.Workers) == 1 && st.Workers[0].Late == 1 && len(ss) == 1 && ss[0].Rejected > 0 {
			if !st.Workers[0].Connected || ss[0].CreditIn != 0 || ss[0].Ended {
				t.Fatalf("late result: worker %+v session %+v", st.Workers[0], ss[0])
			}
			// The late RESULT, and the DISPATCH it answered: a request
			// is paid only with an accepted answer.
			if want := wire.DispatchSize(4, m.D, m.K) + 28 + 4*8*m.D; ss[0].Rejected != uint64(want) {
				t.Fatalf("rejected %d bytes, want the DISPATCH's and the RESULT's %d", ss[0].Rejected, want)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("late result not seen: %+v %+v", st.Workers, ss)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The worker still serves.
	s.run(t, randomCall(t, m, rand.New(rand.NewPCG(9, 10)), 0, 2))
	if st := s.disp.Stats(); st.ExpertsRemote != 4 {
		t.Fatalf("after recovery remote = %d, want 4", st.ExpertsRemote)
	}
}

// TestWorkerStallRoutedAround, on the default deadlines: a worker that
// stops answering (a frozen process) costs the call that finds out one
// deadline (5 s before the worker has round-trip samples); the calls after
// it compute its experts here at once instead of each waiting out a
// deadline, until the worker speaks again (its late RESULT), when it gets
// work again.
func TestWorkerStallRoutedAround(t *testing.T) {
	m := testModel()
	s := newStack(t, m, 0, nil)
	comp := &fakeExperts{d: m.D, nExpert: m.NExpert, block: make(chan struct{})}
	s.startWorker(t, comp, 0, 1, 2, 3)
	s.waitWorkers(t, 1)
	rng := rand.New(rand.NewPCG(15, 16))
	if el := s.run(t, randomCall(t, m, rng, 0, 2)); el < 4*time.Second {
		t.Fatalf("first call took %v, want the 5 s default deadline", el)
	}
	if st := s.disp.Stats(); !st.Workers[0].Stalled || st.Workers[0].Stalls != 1 || st.Workers[0].Timeouts != 1 {
		t.Fatalf("after the missed deadline: %+v", st.Workers[0])
	}
	t0 := time.Now()
	for l := range 4 {
		s.run(t, randomCall(t, m, rng, l, 3))
	}
	if el := time.Since(t0); el > 2*time.Second { // 4 calls: 20 s if each waited out a deadline
		t.Fatalf("4 calls while the worker was stalled took %v", el)
	}
	if st := s.disp.Stats(); comp.calls.Load() != 1 || st.ExpertsLocal != 4+4*6 || st.Workers[0].Timeouts != 1 {
		t.Fatalf("while stalled: worker calls %d, local %d, timeouts %d", comp.calls.Load(), st.ExpertsLocal, st.Workers[0].Timeouts)
	}
	close(comp.block) // the worker resumes: its late RESULT arrives
	waitUntil(t, 5*time.Second, "the worker back in the index", func() bool { return !s.disp.Stats().Workers[0].Stalled })
	s.run(t, randomCall(t, m, rng, 1, 3))
	if st := s.disp.Stats(); st.ExpertsRemote != 6 || comp.calls.Load() != 2 {
		t.Fatalf("after it answered: remote %d, worker calls %d", st.ExpertsRemote, comp.calls.Load())
	}
}

// TestPause: a paused worker gets no work (computed locally), and resumes.
func TestPause(t *testing.T) {
	m := testModel()
	s := newStack(t, m, 0, nil)
	comp := newFake(m)
	w, _ := s.startWorker(t, comp, 0, 1, 2, 3)
	s.waitWorkers(t, 1)
	rng := rand.New(rand.NewPCG(11, 12))
	w.Pause()
	waitFor(t, func() bool { st := s.disp.Stats(); return len(st.Workers) == 1 && st.Workers[0].Paused })
	if st := w.Stats(); st.State.String() != "paused" || st.Reason != "paused" {
		t.Fatalf("worker stats %+v", st)
	}
	s.run(t, randomCall(t, m, rng, 0, 3))
	if comp.calls.Load() != 0 || s.disp.Stats().ExpertsLocal != 6 {
		t.Fatalf("paused worker computed %d calls", comp.calls.Load())
	}
	w.Resume()
	waitFor(t, func() bool { st := s.disp.Stats(); return !st.Workers[0].Paused })
	s.run(t, randomCall(t, m, rng, 0, 3))
	if comp.calls.Load() != 1 || s.disp.Stats().ExpertsRemote != 6 {
		t.Fatalf("resumed worker: calls %d", comp.calls.Load())
	}
	w.FinishThenPause()
	waitFor(t, func() bool { st := s.disp.Stats(); return st.Workers[0].Paused })
	if st := w.Stats(); st.State.String() != "paused" || st.Rows != 3 || st.Requests != 1 {
		t.Fatalf("worker stats %+v", st)
	}
}

// TestLedgerEntries: the hub's ledger deltas sum to the session totals and
// the last entry of a session is Final.
func TestLedgerEntries(t *testing.T) {
	m := testModel()
	s := newStack(t, m, 0, nil)
	_, stop := s.startWorker(t, newFake(m), 0, 1, 2, 3)
	s.waitWorkers(t, 1)
	rng := rand.New(rand.NewPCG(13, 14))
	for i := 0; i < 5; i++ {
		s.run(t, randomCall(t, m, rng, i%m.NLayer, 4))
		time.Sleep(30 * time.Millisecond)
	}
	stop()
	waitFor(t, func() bool { ss := s.hub.Sessions(); return len(ss) == 1 && ss[0].Ended })
	ss := s.hub.Sessions()[0]
	var in, out, rej uint64
	es := s.meter.entries()
	for i, e := range es {
		if e.SessionID != ss.ID || e.WorkerID != ss.WorkerID || len(e.WorkerID) != 64 {
			t.Fatalf("entry %d: %+v", i, e)
		}
		if e.Final != (i == len(es)-1) {
			t.Fatalf("entry %d Final = %v of %d", i, e.Final, len(es))
		}
		in, out, rej = in+e.BytesIn, out+e.BytesOut, rej+e.RejectedBytes
	}
	if len(es) < 2 || in != ss.CreditIn || out != ss.CreditOut || rej != ss.Rejected || in == 0 {
		t.Fatalf("%d entries sum in %d out %d rej %d; session %+v", len(es), in, out, rej, ss)
	}
	if !strings.Contains(ss.Reason, "worker closed") {
		t.Fatalf("reason %q", ss.Reason)
	}
	_ = wire.Version
}

// TestReplicasShareWork: two workers holding the same experts both get work
// (the replica rotates per call) and the numbers stay identical.
func TestReplicasShareWork(t *testing.T) {
	m := testModel()
	s := newStack(t, m, 0, nil)
	a := newFake(m)
	b := newFake(m)
	s.startWorker(t, a, 0, 1, 2, 3)
	s.startWorker(t, b, 0, 1, 2, 3)
	s.waitWorkers(t, 2)
	rng := rand.New(rand.NewPCG(51, 52))
	for i := 0; i < 8; i++ {
		s.run(t, randomCall(t, m, rng, i%m.NLayer, 6))
	}
	if a.calls.Load() == 0 || b.calls.Load() == 0 {
		t.Fatalf("calls a %d b %d: replicas not shared", a.calls.Load(), b.calls.Load())
	}
	if st := s.disp.Stats(); st.ExpertsLocal != 0 || st.ExpertsRemote != 8*6*uint64(m.K) {
		t.Fatalf("local %d remote %d", st.ExpertsLocal, st.ExpertsRemote)
	}
}
