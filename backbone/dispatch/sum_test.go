package dispatch_test

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// randomWeights returns n x k router-like weights: positive, each row
// normalised (any floats would do: the sums must match whatever they are).
func randomWeights(rng *rand.Rand, n, k int) []float32 {
	w := make([]float32, n*k)
	for r := 0; r < n; r++ {
		var sum float32
		for s := 0; s < k; s++ {
			w[r*k+s] = rng.Float32() + 1e-3
			sum += w[r*k+s]
		}
		for s := 0; s < k; s++ {
			w[r*k+s] /= sum
		}
	}
	return w
}

// runSum computes c's row sums with weights w through the dispatcher
// (ComputeExpertsSum) and checks them bit for bit against
// expert.WeightedSum of the reference pair outputs.
func (s *stack) runSum(tb testing.TB, c call, w []float32) time.Duration {
	tb.Helper()
	D := s.model.D
	want := make([]float32, c.n*D)
	expert.WeightedSum(want, c.want, w, c.k, D)
	out := make([]float32, c.n*D)
	for i := range out {
		out[i] = math.Float32frombits(0x7fc00001) // NaN poison
	}
	start := time.Now()
	if err := s.disp.ComputeExpertsSum(context.Background(), c.layer, c.hidden, c.ids, w, c.n, c.k, out); err != nil {
		tb.Fatalf("ComputeExpertsSum: %v", err)
	}
	el := time.Since(start)
	for i := range out {
		if fbits(out[i]) != fbits(want[i]) {
			tb.Fatalf("layer %d: sum[%d] = %v, want %v (bit-identical)", c.layer, i, out[i], want[i])
		}
	}
	return el
}

// TestSumBitIdentical: two workers through gateway (TLS) and hub hold
// layers 0-1 and 2-3, so every row has a full holder. With row sums every
// request is a DISPATCH_SUM, the sums equal WeightedSum of the local
// reference bit for bit, no expert is computed locally, and the hub meters
// each sum RESULT as the RESULT of its pairs (Results*28 + 4*Pairs*D) while
// the workers upload one row of D floats per row; with NoRowSums the same
// sums come from per-pair requests.
func TestSumBitIdentical(t *testing.T) {
	m := testModel()
	for _, off := range []bool{false, true} {
		s := newStack(t, m, 0, func(c *dispatch.Config) { c.NoRowSums = off })
		s.startWorker(t, &fakeExperts{d: m.D, nExpert: m.NExpert, holds: holdsLayers(0, 1)}, 0, 1)
		s.startWorker(t, &fakeExperts{d: m.D, nExpert: m.NExpert, holds: holdsLayers(2, 3)}, 2, 3)
		s.waitWorkers(t, 2)
		rng := rand.New(rand.NewPCG(71, 72))
		for _, n := range []int{1, 3, 17} {
			for l := 0; l < m.NLayer; l++ {
				s.runSum(t, randomCall(t, m, rng, l, n), randomWeights(rng, n, m.K))
			}
		}
		st := s.disp.Stats()
		rows := uint64((1 + 3 + 17) * m.NLayer)
		if st.ExpertsLocal != 0 || st.ExpertsRemote != rows*uint64(m.K) || s.local.calls.Load() != 0 {
			t.Fatalf("sums off %v: remote %d local %d local calls %d", off, st.ExpertsRemote, st.ExpertsLocal, s.local.calls.Load())
		}
		if wantReqs := uint64(12); off && (st.SumRequests != 0 || st.SumRows != 0) || !off && (st.SumRequests != wantReqs || st.SumRows != rows) {
			t.Fatalf("sums off %v: %d sum requests of %d rows", off, st.SumRequests, st.SumRows)
		}
		// Metering: DISPATCH_SUM = 24 + 4 n (d + 2k) (weights), its
		// RESULT credited as 28 + 4 (n k) d, the RESULT of its pairs.
		var wantOut, wantIn, results uint64
		for _, w := range st.Workers {
			if w.Results != w.Requests || w.Timeouts != 0 || w.Pairs != w.Rows*uint64(m.K) {
				t.Fatalf("worker %s: requests %d results %d timeouts %d rows %d pairs %d", w.ID[:8], w.Requests, w.Results, w.Timeouts, w.Rows, w.Pairs)
			}
			per := uint64(m.D + m.K)
			if !off {
				per += uint64(m.K)
			}
			wantOut += w.Requests*24 + 4*w.Rows*per
			wantIn += w.Results*28 + 4*w.Pairs*uint64(m.D)
			results += w.Results
		}
		gotOut, gotIn, rej, up := s.hubTotals(t)
		if gotOut != wantOut || gotIn != wantIn || rej != 0 {
			t.Fatalf("sums off %v: hub metered out %d in %d rejected %d; want %d %d 0", off, gotOut, gotIn, rej, wantOut, wantIn)
		}
		// The upload itself: a RESULT of one row of D per row (28 + 4 n D
		// each) with sums, else one per pair; the rest is HELLO and pings.
		resultBytes := results*28 + 4*rows*uint64(m.D)
		if off {
			resultBytes = results*28 + 4*rows*uint64(m.K*m.D)
		}
		if up < resultBytes || up > resultBytes+4096 {
			t.Fatalf("sums off %v: workers uploaded %d bytes, RESULTs %d", off, up, resultBytes)
		}
	}
}

// TestSumMixedHolders: worker A holds experts 0-3 of every layer, B 4-7;
// a row whose two experts are on one side goes to that worker as a
// DISPATCH_SUM, a row split over both as per-pair requests to each, in the
// same call; every sum is bit-identical and nothing is computed locally.
func TestSumMixedHolders(t *testing.T) {
	m := testModel()
	s := newStack(t, m, 0, nil)
	lo := func(l, e int) bool { return e < 4 }
	hi := func(l, e int) bool { return e >= 4 }
	s.startWorkerWith(t, &fakeExperts{d: m.D, nExpert: m.NExpert, holds: lo}, holdingsWhere(m, lo))
	s.startWorkerWith(t, &fakeExperts{d: m.D, nExpert: m.NExpert, holds: hi}, holdingsWhere(m, hi))
	s.waitWorkers(t, 2)
	rng := rand.New(rand.NewPCG(73, 74))
	var full, split int
	const n = 17
	for l := 0; l < m.NLayer; l++ {
		c := randomCall(t, m, rng, l, n)
		for r := 0; r < n; r++ {
			if (c.ids[r*m.K] < 4) == (c.ids[r*m.K+1] < 4) {
				full++
			} else {
				split++
			}
		}
		s.runSum(t, c, randomWeights(rng, n, m.K))
	}
	st := s.disp.Stats()
	var reqs uint64
	for _, w := range st.Workers {
		reqs += w.Requests
	}
	if full == 0 || split == 0 || st.SumRows != uint64(full) || reqs <= st.SumRequests ||
		st.ExpertsLocal != 0 || st.ExpertsRemote != uint64(n*m.NLayer*m.K) {
		t.Fatalf("%d full rows, %d split: sum rows %d, sum requests %d of %d, remote %d local %d",
			full, split, st.SumRows, st.SumRequests, reqs, st.ExpertsRemote, st.ExpertsLocal)
	}
}

// TestSumLiarCaught: a worker process that lies in every answer (its
// expert outputs scaled by 1.01, so its sums are wrong) holds every
// expert; its first DISPATCH_SUM is checked (probation) against the
// WeightedSum of the backbone's own pair outputs, caught, and replaced:
// the sums are still bit-identical, the key is banned, and the gateway
// credits it nothing.
func TestSumLiarCaught(t *testing.T) {
	m := testModel()
	s, l := ledgerStack(t, m, func(c *dispatch.Config) { c.Probation = 0 }) // the default: every result checked
	key, id := newKey()
	s.startTrustChild(t, childEnv(key, fakeSpec(m), "KVASIR_LIE", "always"), true)
	s.waitWorkers(t, 1)
	rng := rand.New(rand.NewPCG(75, 76))
	s.runSum(t, randomCall(t, m, rng, 1, 6), randomWeights(rng, 6, m.K))
	st := s.disp.Stats()
	if st.SumRequests != 1 || st.Mismatches != 1 || st.Caught != 1 || st.Banned != 1 || st.ExpertsLocal != 6*uint64(m.K) {
		t.Fatalf("sum requests %d mismatches %d caught %d banned %d local %d", st.SumRequests, st.Mismatches, st.Caught, st.Banned, st.ExpertsLocal)
	}
	nkvr := endSessions(t, s, l)
	if b, rej := ledgerOf(t, l, id); nkvr[id] != 0 || b != 0 || rej < uint64(wire.DispatchSumSize(6, m.D, m.K)) {
		t.Fatalf("liar credited %d nKVR, ledger %d creditable %d rejected", nkvr[id], b, rej)
	}
}

// TestSumWorkerKilled: two worker processes hold every expert, so the
// rows' sums rotate between them; one is SIGKILLed while it computes its
// DISPATCH_SUM. Its rows' pairs go to the other as a per-pair replica
// request, and the call's sums are bit-identical and fully remote.
func TestSumWorkerKilled(t *testing.T) {
	m := testModel()
	const maxDL = 3 * time.Second
	s, _, _ := killedReplicaStack(t, m, maxDL)
	const rows = 16
	rng := rand.New(rand.NewPCG(77, 78))
	el := s.runSum(t, randomCall(t, m, rng, 1, rows), randomWeights(rng, rows, m.K))
	st := s.disp.Stats()
	if st.SumRequests != 2 || st.ExpertsLocal != 0 || st.ExpertsRemote != rows*uint64(m.K) || st.Failovers == 0 || st.ReplicaPairs == 0 || el > maxDL {
		t.Fatalf("in %v: sum requests %d local %d remote %d failovers %d replica pairs %d", el, st.SumRequests, st.ExpertsLocal, st.ExpertsRemote, st.Failovers, st.ReplicaPairs)
	}
}
