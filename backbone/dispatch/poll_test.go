package dispatch_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
)

// TestPoll: a call polls for its replies on a running core from its start
// until its reply comes or Config.Poll has passed (Stats.PollTime), with
// the same bit-identical outputs as a sleeping call; a NoPoll context and a
// negative Poll sleep at once. The link delays each way by 30 ms, so a
// reply comes >= 60 ms after the call starts.
func TestPoll(t *testing.T) {
	const oneWay = 30 * time.Millisecond
	m := testModel()
	for _, tc := range []struct {
		name   string
		poll   time.Duration
		noPoll bool
		// bounds on Stats.PollTime per call
		min, max time.Duration
	}{
		// The default (100 ms) outlasts the round trip: polled until the
		// reply, >= 60 ms after the call's start less the time to send.
		{"default", 0, false, 40 * time.Millisecond, 2 * time.Second},
		// Polling stops after 10 ms and the call sleeps.
		{"short", 10 * time.Millisecond, false, 1, 10 * time.Millisecond},
		{"off", -1, false, 0, 0},
		{"no-poll-context", 0, true, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStack(t, m, oneWay, func(c *dispatch.Config) { c.Poll = tc.poll })
			s.startHolder(t, newFake(m), 0)
			s.waitWorkers(t, 1)
			rng := rand.New(rand.NewPCG(7, uint64(len(tc.name))))
			const calls = 3
			for range calls {
				c := randomCall(t, m, rng, 0, 2)
				out := make([]float32, len(c.want))
				ctx := context.Background()
				if tc.noPoll {
					ctx = dispatch.NoPoll(ctx)
				}
				if err := s.disp.ComputeExperts(ctx, c.layer, c.hidden, c.ids, c.n, c.k, out); err != nil {
					t.Fatal(err)
				}
				for i := range out {
					if fbits(out[i]) != fbits(c.want[i]) {
						t.Fatalf("out[%d] = %v, want %v (bit-identical)", i, out[i], c.want[i])
					}
				}
			}
			st := s.disp.Stats()
			if st.ExpertsRemote != calls*2*uint64(m.K) {
				t.Fatalf("remote outputs %d, want %d: the calls must wait for the worker", st.ExpertsRemote, calls*2*m.K)
			}
			// The last look of a poll may end one yield after its limit:
			// a loaded machine's scheduler slice is the slack allowed.
			const slack = 20 * time.Millisecond
			lo, hi := calls*tc.min, calls*(tc.max+slack)
			if tc.max == 0 {
				hi = 0
			}
			if st.PollTime < lo || st.PollTime > hi {
				t.Fatalf("PollTime %v over %d calls, want in [%v, %v]", st.PollTime, calls, lo, hi)
			}
		})
	}
}
