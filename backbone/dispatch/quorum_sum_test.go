package dispatch_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// quorumSums is quorumCfg with audits as given and a 2 s deadline floor:
// on a loaded machine no request is late, so every decision is the one
// under test (a late opinion is a failed one).
func quorumSums(rate float64, mod func(*dispatch.Config)) func(*dispatch.Config) {
	return quorumCfg(func(c *dispatch.Config) {
		c.CheckRate, c.MinDeadline = rate, 2*time.Second
		if mod != nil {
			mod(c)
		}
	})
}

// TestQuorumSumDigests (wire 7): two honest CPU holders of every expert
// under quorum, row sums on (ComputeExpertsSum): every row goes as a sum
// group, one holder answering its DISPATCH_SUM with the rows' sums, the
// other its DISPATCH_SUM_DIGEST with the DIGEST of that sum RESULT. The
// sums equal expert.WeightedSum of the local reference bit for bit,
// nothing is computed locally, nobody is caught, and the hub meters
// exactly: each DISPATCH_SUM(_DIGEST) 24 + 4n(d + 2k) bytes out, and each
// sum RESULT and sum DIGEST as the RESULT of its n*k pairs, 28 + 4nkd;
// the workers upload one row of d per sum RESULT row and 52 bytes per
// DIGEST.
func TestQuorumSumDigests(t *testing.T) {
	m := testModel()
	s := newStack(t, m, 0, quorumSums(-1, nil))
	s.startHolder(t, newFake(m), 0, 1, 2, 3)
	s.startHolder(t, newFake(m), 0, 1, 2, 3)
	s.waitWorkers(t, 2)
	rng := rand.New(rand.NewPCG(81, 82))
	rows := uint64(0)
	for i := 0; i < 16; i++ {
		n := 1 + i%6
		s.runSum(t, randomCall(t, m, rng, i%m.NLayer, n), randomWeights(rng, n, m.K))
		rows += uint64(n)
	}
	st := s.disp.Stats()
	if st.ExpertsLocal != 0 || st.ExpertsRemote != rows*uint64(m.K) || s.local.calls.Load() != 0 || st.Caught != 0 ||
		st.QuorumRequests == 0 || st.QuorumAgreed != st.QuorumRequests || st.Digests != st.QuorumRequests ||
		st.SumRequests != 2*st.QuorumRequests || st.SumRows != 2*rows || st.QuorumDisputes != 0 {
		t.Fatalf("stats %+v", st)
	}
	var wantOut, wantIn uint64
	for _, w := range st.Workers {
		if w.Digests == 0 || w.Results == w.Digests || w.Pairs != w.Rows*uint64(m.K) || w.Results != w.Requests {
			t.Fatalf("worker %+v: both answer sum RESULTs and DIGESTs (random pairing), every request answered", w)
		}
		wantOut += w.Requests*24 + 4*w.Rows*uint64(m.D+2*m.K)
		wantIn += w.Results*28 + 4*w.Pairs*uint64(m.D)
	}
	gotOut, gotIn, rej, up := s.hubTotals(t)
	if gotOut != wantOut || gotIn != wantIn || rej != 0 {
		t.Fatalf("hub metered out %d in %d rejected %d; want %d %d 0", gotOut, gotIn, rej, wantOut, wantIn)
	}
	// Uploaded: a sum RESULT per A request (28 + 4 n d), a DIGEST (52)
	// per B request; the rest is HELLO and pings.
	answers := (st.QuorumRequests)*28 + 4*rows*uint64(m.D) + st.Digests*uint64(wire.DigestSize)
	if up < answers || up > answers+4096 {
		t.Fatalf("workers uploaded %d bytes, answers %d", up, answers)
	}
}

// TestQuorumSumLiar: an always-lying CPU holder beside two honest ones,
// row sums on: the sums stay bit-identical and the liar is caught at its
// first lie; the backbone decides a disputed sum with its own outputs'
// sums, or, when it computes no expert (LocalHeld false), a third full
// holder's sum RESULT decides (QuorumAsks).
func TestQuorumSumLiar(t *testing.T) {
	m := testModel()
	for _, backboneOnly := range []bool{false, true} {
		s := newStack(t, m, 0, quorumSums(-1, func(c *dispatch.Config) {
			if backboneOnly {
				c.LocalHeld = func(l, e int) bool { return false }
			}
		}))
		s.startHolder(t, newFake(m), 0, 1, 2, 3)
		s.startHolder(t, newFake(m), 0, 1, 2, 3)
		liar, _ := s.startHolder(t, newScaled(m, 1e-3), 0, 1, 2, 3)
		s.waitWorkers(t, 3)
		rng := rand.New(rand.NewPCG(83, 84))
		for i := 0; i < 12; i++ {
			s.runSum(t, randomCall(t, m, rng, i%m.NLayer, 3), randomWeights(rng, 3, m.K))
		}
		st := s.disp.Stats()
		if st.Caught != 1 || st.SumRequests == 0 || st.QuorumDisputes == 0 || (backboneOnly && (st.QuorumAsks == 0 || st.ExpertsLocal != 0)) {
			t.Fatalf("backbone-only %v: stats %+v", backboneOnly, st)
		}
		if w, ok := workerByID(st, liar); !ok || w.Connected || w.Mismatches == 0 {
			t.Fatalf("backbone-only %v: liar %+v", backboneOnly, w)
		}
	}
}

// TestQuorumSumColludersAudited: two holders that compute the same wrong
// outputs agree on their sums (digest = hash of the sum RESULT); with
// audits (CheckRate 1) the agreed sums are compared with the sums of the
// backbone's own outputs: the sums stay bit-identical and both are caught.
func TestQuorumSumColludersAudited(t *testing.T) {
	m := testModel()
	liar := func() *scaled { return newScaled(m, 1e-3) }
	s := newStack(t, m, 0, quorumSums(1, nil))
	s.startHolder(t, liar(), 0, 1, 2, 3)
	s.startHolder(t, liar(), 0, 1, 2, 3)
	s.waitWorkers(t, 2)
	rng := rand.New(rand.NewPCG(85, 86))
	s.runSum(t, randomCall(t, m, rng, 1, 4), randomWeights(rng, 4, m.K))
	if st := s.disp.Stats(); st.Caught != 2 || st.QuorumAudits == 0 || st.SumRequests == 0 || st.ExpertsRemote != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestQuorumSumWhichRows: on a backbone that computes no expert, two full
// holders A and B of every expert and two half holders (even experts, odd
// experts): every pair has three holder keys, a row of one parity three
// full ones (it goes as a sum group), a row of mixed parity only two, so
// that a disputed sum could not be decided while a disputed pair could:
// it goes per pair. Without the half holders no pair has a third key
// either, and every row goes as a sum. The sums are bit-identical.
func TestQuorumSumWhichRows(t *testing.T) {
	m := testModel()
	for _, halves := range []bool{true, false} {
		s := newStack(t, m, 0, quorumSums(-1, func(c *dispatch.Config) { c.LocalHeld = func(l, e int) bool { return false } }))
		s.startHolder(t, newFake(m), 0, 1, 2, 3)
		s.startHolder(t, newFake(m), 0, 1, 2, 3)
		if halves {
			for par := range 2 {
				hold := func(l, e int) bool { return e%2 == par }
				s.startInProc(t, &fakeExperts{d: m.D, nExpert: m.NExpert, holds: hold}, holdingsWhere(m, hold), backend("cpu"))
			}
			s.waitWorkers(t, 4)
		} else {
			s.waitWorkers(t, 2)
		}
		rng := rand.New(rand.NewPCG(87, 88))
		var sumRows, mixed uint64
		for i := 0; i < 8; i++ {
			c := randomCall(t, m, rng, i%m.NLayer, 5)
			for r := 0; r < c.n; r++ {
				if halves && c.ids[r*m.K]%2 != c.ids[r*m.K+1]%2 {
					mixed++
				} else {
					sumRows++
				}
			}
			s.runSum(t, c, randomWeights(rng, 5, m.K))
		}
		st := s.disp.Stats()
		// Each sum row is in one DISPATCH_SUM and one DISPATCH_SUM_DIGEST.
		if st.SumRows != 2*sumRows || (halves && mixed == 0) || st.ExpertsLocal != 0 || st.Caught != 0 || st.QuorumAgreed != st.QuorumRequests {
			t.Fatalf("half holders %v: %d rows of one parity, %d mixed; sum rows %d, stats %+v", halves, sumRows, mixed, st.SumRows, st)
		}
	}
}
