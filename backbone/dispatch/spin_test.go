package dispatch_test

import (
	"errors"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/engine/idlespin"
)

// spinSupported skips where this build has no spinner threads (starting
// them as a dispatcher on the defaults does: the first start sets them).
func spinSupported(t *testing.T) {
	t.Helper()
	if err := idlespin.Start(runtime.GOMAXPROCS(0), dispatch.DefaultSpinWait); errors.Is(err, idlespin.ErrUnsupported) {
		t.Skip(err)
	}
}

// TestSpinThroughRoundTrip (issue 19): on the defaults a call that waits
// for a worker 2 x 10 ms away keeps the CPUs spinning while it waits (the
// spinners are seen spinning during the call, and their holds and CPU time
// grow; from the second call, once the calls' average wait is known to be
// above DefaultSpinMinWait), then lets them sleep; the outputs are the
// worker's bit for bit.
func TestSpinThroughRoundTrip(t *testing.T) {
	spinSupported(t)
	m := testModel()
	s := newStack(t, m, 10*time.Millisecond, nil)
	s.startWorker(t, newFake(m), 0, 1, 2, 3)
	s.waitWorkers(t, 1)
	before := idlespin.Read()
	rng := rand.New(rand.NewPCG(5, 6))
	seen := false
	for i := 0; i < 200 && !seen || i < 8; i++ {
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.run(t, randomCall(t, m, rng, i%m.NLayer, 3))
		}()
		for waiting := true; waiting; {
			select {
			case <-done:
				waiting = false
			case <-time.After(time.Millisecond):
				seen = seen || idlespin.Read().Spinning > 0
			}
		}
	}
	if !seen {
		t.Fatal("no spinner seen spinning during 200 calls that wait 20 ms each")
	}
	st := s.disp.Stats()
	after := idlespin.Read()
	if st.SpinThreads < 1 || st.SpinThreads > runtime.GOMAXPROCS(0) || after.Holds < before.Holds+5 {
		t.Fatalf("spin threads %d (GOMAXPROCS %d), holds %d -> %d", st.SpinThreads, runtime.GOMAXPROCS(0), before.Holds, after.Holds)
	}
	waitUntil(t, 5*time.Second, "spinners asleep after the calls", func() bool { return idlespin.Read().Spinning == 0 })
	if st := s.disp.Stats(); st.SpinCPU <= before.CPU {
		t.Fatalf("spinner CPU %v -> %v", before.CPU, st.SpinCPU)
	}
}

// TestSpinOff: with SpinWait negative a dispatcher never holds the
// spinners (even when another started them) and reports none.
func TestSpinOff(t *testing.T) {
	spinSupported(t)
	m := testModel()
	s := newStack(t, m, time.Millisecond, func(c *dispatch.Config) { c.SpinWait = -1 })
	s.startWorker(t, newFake(m), 0, 1, 2, 3)
	s.waitWorkers(t, 1)
	before := idlespin.Read()
	rng := rand.New(rand.NewPCG(7, 8))
	for i := range 8 {
		s.run(t, randomCall(t, m, rng, i%m.NLayer, 2))
	}
	if after := idlespin.Read(); after.Holds != before.Holds {
		t.Fatalf("holds %d -> %d with SpinWait -1", before.Holds, after.Holds)
	}
	if st := s.disp.Stats(); st.SpinThreads != 0 || st.SpinCPU != 0 {
		t.Fatalf("stats with spinning off: threads %d cpu %v", st.SpinThreads, st.SpinCPU)
	}
}

// TestSpinOnlyWhenRequestsGo: a call whose pairs no worker holds (all
// computed here) does not wake the spinners; one sent to a worker 10 ms
// away does.
func TestSpinOnlyWhenRequestsGo(t *testing.T) {
	spinSupported(t)
	m := testModel()
	s := newStack(t, m, 5*time.Millisecond, nil)
	s.startWorker(t, &fakeExperts{d: m.D, nExpert: m.NExpert, holds: holdsLayers(1)}, 1)
	s.waitWorkers(t, 1)
	rng := rand.New(rand.NewPCG(9, 10))
	for range 4 { // the calls' average wait rises above DefaultSpinMinWait
		s.run(t, randomCall(t, m, rng, 1, 2))
	}
	before := idlespin.Read().Holds
	s.run(t, randomCall(t, m, rng, 0, 4)) // layer 0: nobody holds it
	if h := idlespin.Read().Holds; h != before {
		t.Fatalf("a local-only call held the spinners (%d -> %d holds)", before, h)
	}
	s.run(t, randomCall(t, m, rng, 1, 4))
	if h := idlespin.Read().Holds; h != before+1 {
		t.Fatalf("a remote call: %d -> %d holds, want one", before, h)
	}
}

// TestNoSpinOnShortWaits: calls whose average wait is below SpinMinWait
// (here 1 h, for a test that does not depend on the machine's speed) never
// hold the spinners, however many go out.
func TestNoSpinOnShortWaits(t *testing.T) {
	spinSupported(t)
	m := testModel()
	s := newStack(t, m, 5*time.Millisecond, func(c *dispatch.Config) { c.SpinMinWait = time.Hour })
	s.startWorker(t, newFake(m), 0, 1, 2, 3)
	s.waitWorkers(t, 1)
	before := idlespin.Read().Holds
	rng := rand.New(rand.NewPCG(11, 12))
	for i := range 8 {
		s.run(t, randomCall(t, m, rng, i%m.NLayer, 2))
	}
	if h := idlespin.Read().Holds; h != before {
		t.Fatalf("%d holds for calls waiting less than SpinMinWait", h-before)
	}
}
