package dispatch_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// TestHedgeSlowReplica: three workers hold every expert; after a warm-up
// one of them becomes slow (30 ms per call, under its deadline). With
// Hedge, its late requests are sent again to another holder and the
// first answer is used: every output stays bit-identical, nothing is
// computed locally, the slow worker's share of requests drops, and the
// hub's ledger credits exactly the RESULTs used: CreditIn over all
// sessions is 28 bytes per used RESULT plus 4 d bytes per remote output,
// the answers that lost their race are REJECTED (never credited). The same
// with row sums (ComputeExpertsSum): every request, hedges included, is a
// DISPATCH_SUM (a sum job's hedge goes to another full holder) and a sum's
// RESULT is credited as the RESULT of its pairs.
func TestHedgeSlowReplica(t *testing.T) {
	for _, sums := range []bool{false, true} {
		t.Run(fmt.Sprintf("sums=%v", sums), func(t *testing.T) { testHedgeSlowReplica(t, sums) })
	}
}

func testHedgeSlowReplica(t *testing.T, sums bool) {
	m := testModel()
	s := newStack(t, m, 0, func(c *dispatch.Config) { c.Hedge = true })
	ws := []*fakeExperts{{d: m.D, nExpert: m.NExpert}, {d: m.D, nExpert: m.NExpert}, {d: m.D, nExpert: m.NExpert}}
	var stops []func()
	for _, w := range ws {
		_, stop := s.startWorker(t, w, 0, 1, 2, 3)
		stops = append(stops, stop)
	}
	s.waitWorkers(t, 3)
	rng := rand.New(rand.NewPCG(61, 62))
	run := func(c call) time.Duration {
		if sums {
			return s.runSum(t, c, randomWeights(rng, c.n, c.k))
		}
		return s.run(t, c)
	}
	for i := 0; i < 40; i++ { // warm-up: latency samples for every worker
		run(randomCall(t, m, rng, i%m.NLayer, 4))
	}
	slow := ws[2]
	before := slow.calls.Load()
	slow.slow.Store(int64(30 * time.Millisecond))
	var worst time.Duration
	for i := 0; i < 40; i++ {
		worst = max(worst, run(randomCall(t, m, rng, i%m.NLayer, 4)))
	}
	st := s.disp.Stats()
	if st.ExpertsLocal != 0 || st.Hedges == 0 {
		t.Fatalf("local %d hedges %d (slow worker calls %d)", st.ExpertsLocal, st.Hedges, slow.calls.Load()-before)
	}
	// A loser that had not answered when its call ended answers later
	// (REJECTED): wait for that verdict before the workers stop, or
	// stopping cancels its computation and no RESULT comes.
	waitFor(t, func() bool {
		var rejected uint64
		for _, x := range s.hub.Sessions() {
			rejected += x.Rejected
		}
		return rejected > 0
	})
	st = s.disp.Stats()
	if n := slow.calls.Load() - before; n > 20 {
		t.Errorf("the slow worker still got %d of 40 calls' requests", n)
	}
	t.Logf("hedges %d, hedge wins %d, lost %d, slow worker calls after slowing %d, worst call %v",
		st.Hedges, st.HedgeWins, st.HedgeLost, slow.calls.Load()-before, worst)
	var used, reqs uint64
	for _, w := range st.Workers {
		used += w.Results
		reqs += w.Requests
	}
	if sums && st.SumRequests != reqs || !sums && st.SumRequests != 0 {
		t.Fatalf("sums %v: %d of %d requests were DISPATCH_SUMs", sums, st.SumRequests, reqs)
	}
	used -= st.HedgeLost
	slow.slow.Store(0)
	for _, stop := range stops {
		stop()
	}
	waitFor(t, func() bool {
		ss := s.hub.Sessions()
		for _, x := range ss {
			if !x.Ended {
				return false
			}
		}
		return len(ss) == 3
	})
	var creditIn, rejected uint64
	for _, x := range s.hub.Sessions() {
		creditIn += x.CreditIn
		rejected += x.Rejected
	}
	want := used*uint64(wire.ResultSize(0, m.D)) + 4*uint64(m.D)*st.ExpertsRemote
	if creditIn != want {
		t.Fatalf("credited %d RESULT bytes, want %d (%d used RESULTs, %d outputs)", creditIn, want, used, st.ExpertsRemote)
	}
	if st.Hedges > 0 && rejected == 0 {
		t.Fatalf("no loser's RESULT rejected (hedges %d)", st.Hedges)
	}
}

// TestHedgeAnswerVerified: the hedge of a slow worker's request goes to a
// worker that lies; with every request checked, the lying hedge answer is
// compared like any other, caught (banned, its session closed) and never
// used: the outputs stay bit-identical.
func TestHedgeAnswerVerified(t *testing.T) {
	m := testModel()
	s := newStack(t, m, 0, func(c *dispatch.Config) { c.Hedge = true; c.CheckRate = 1 })
	good := newFake(m)
	liar := &liarExperts{fakeExperts: fakeExperts{d: m.D, nExpert: m.NExpert}}
	s.startWorker(t, good, 0, 1, 2, 3)
	s.startWorkerWith(t, liar, holdings(m, 0, 1, 2, 3))
	s.waitWorkers(t, 2)
	liar.slow.Store(int64(5 * time.Millisecond)) // slower: the requests go to good
	rng := rand.New(rand.NewPCG(71, 72))
	for i := 0; i < 40; i++ {
		s.run(t, randomCall(t, m, rng, i%m.NLayer, 4))
	}
	good.slow.Store(int64(30 * time.Millisecond))
	liar.slow.Store(0)
	liar.lie.Store(true)
	for i := 0; i < 20 && s.disp.Stats().Caught == 0; i++ {
		s.run(t, randomCall(t, m, rng, i%m.NLayer, 4))
	}
	st := s.disp.Stats()
	if st.Caught != 1 || st.Mismatches == 0 || st.Hedges == 0 {
		t.Fatalf("caught %d mismatches %d hedges %d", st.Caught, st.Mismatches, st.Hedges)
	}
	for _, w := range st.Workers {
		if !w.Connected && !strings.Contains(w.Reason, "verification failed") {
			t.Fatalf("ended session: %q", w.Reason)
		}
	}
}

// liarExperts computes as fakeExperts, but once lie is set adds 1 to
// every output.
type liarExperts struct {
	fakeExperts
	lie atomic.Bool
}

func (l *liarExperts) ComputeExperts(ctx context.Context, layer int, hidden []float32, ids []int32, n, k int, out []float32) error {
	if err := l.fakeExperts.ComputeExperts(ctx, layer, hidden, ids, n, k, out); err != nil {
		return err
	}
	if l.lie.Load() {
		for i := range out {
			out[i]++
		}
	}
	return nil
}
