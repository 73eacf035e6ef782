package dispatch_test

import (
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
)

// TestSpinWait: a small call polls for its replies on a running core
// (Config.SpinWait, on by default) and a call of more than SpinRows rows,
// a dispatcher with SpinWait < 0 or a process with GOMAXPROCS 1 blocks at
// once; the outputs are the local reference's bits in every case. The
// round trip is 2 x 4 ms, so a polling call spends most of it polling.
func TestSpinWait(t *testing.T) {
	m := testModel()
	rng := rand.New(rand.NewPCG(7, 8))
	for _, tc := range []struct {
		name     string
		spinWait time.Duration
		rows     int
		procs    int
		polls    bool
	}{
		{"default-1-row", 0, 1, 0, true},
		{"default-16-rows", 0, dispatch.DefaultSpinRows, 0, true},
		{"default-17-rows", 0, dispatch.DefaultSpinRows + 1, 0, false},
		{"off", -1, 1, 0, false},
		{"gomaxprocs-1", 0, 1, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.procs == 0 && runtime.GOMAXPROCS(0) < 2 {
				t.Skip("needs GOMAXPROCS >= 2 to poll")
			}
			s := newStack(t, m, 4*time.Millisecond, func(c *dispatch.Config) { c.SpinWait = tc.spinWait })
			s.startWorker(t, &fakeExperts{d: m.D, nExpert: m.NExpert}, 0)
			s.waitWorkers(t, 1)
			if tc.procs > 0 {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(tc.procs))
			}
			const calls = 5
			for range calls {
				s.run(t, randomCall(t, m, rng, 0, tc.rows))
			}
			st := s.disp.Stats()
			if st.ExpertsRemote != uint64(calls*tc.rows*m.K) {
				t.Fatalf("%d pairs computed remotely, want %d", st.ExpertsRemote, calls*tc.rows*m.K)
			}
			// Each call waits at least the 8 ms link round trip; a polling
			// call spends it polling, less the wait before its first poll.
			if polled := st.SpinTime; tc.polls && polled < calls*4*time.Millisecond || !tc.polls && polled != 0 {
				t.Errorf("polled %v over %d calls; want polling %v", polled, calls, tc.polls)
			}
		})
	}
}
