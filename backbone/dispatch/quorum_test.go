package dispatch_test

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
)

func quorumCfg(mod func(*dispatch.Config)) func(*dispatch.Config) {
	return func(c *dispatch.Config) {
		c.Verify = dispatch.VerifyQuorum
		c.MaxDeadline = 3 * time.Second
		if mod != nil {
			mod(c)
		}
	}
}

// TestQuorumHonestDigests: two honest CPU holders under quorum: every
// request goes to both, the second answers with a DIGEST, the outputs are
// bit-identical and remote, nothing is recomputed, nobody is caught.
func TestQuorumHonestDigests(t *testing.T) {
	m := testModel()
	s := newStack(t, m, 0, quorumCfg(nil))
	s.startHolder(t, newFake(m), 0, 1, 2, 3)
	s.startHolder(t, newFake(m), 0, 1, 2, 3)
	s.waitWorkers(t, 2)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20; i++ {
		s.run(t, randomCall(t, m, rng, i%m.NLayer, 1+i%5))
	}
	st := s.disp.Stats()
	if st.Verify != dispatch.VerifyQuorum || st.ExpertsLocal != 0 || st.QuorumRequests == 0 ||
		st.QuorumAgreed != st.QuorumRequests || st.Digests != st.QuorumRequests || st.Caught != 0 || st.QuorumDisputes != 0 {
		t.Fatalf("stats %+v", st)
	}
	for _, w := range st.Workers {
		if w.Digests == 0 || w.Results == 0 {
			t.Fatalf("worker %+v: both answer RESULTs and DIGESTs (random pairing)", w)
		}
	}
}

// TestQuorumOneHolderComputedLocally: with one holder the backbone
// computes every pair itself; the lone worker's answers are never used
// unconfirmed.
func TestQuorumOneHolderComputedLocally(t *testing.T) {
	m := testModel()
	s := newStack(t, m, 0, quorumCfg(nil))
	s.startHolder(t, newFake(m), 0, 1, 2, 3)
	s.waitWorkers(t, 1)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 5; i++ {
		s.run(t, randomCall(t, m, rng, i%m.NLayer, 3))
	}
	if st := s.disp.Stats(); st.ExpertsRemote != 0 || st.ExpertsLocal != 5*3*uint64(m.K) || st.Workers[0].Requests != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestQuorumLiarOutvotedLocal: an always-lying CPU holder beside an honest
// one: every disagreement is decided by the backbone's computation, the
// outputs stay bit-identical, and the liar is caught at its first lie.
func TestQuorumLiarOutvotedLocal(t *testing.T) {
	m := testModel()
	s := newStack(t, m, 0, quorumCfg(nil))
	s.startHolder(t, newFake(m), 0, 1, 2, 3)
	liar, _ := s.startHolder(t, newScaled(m, 1e-3), 0, 1, 2, 3)
	s.waitWorkers(t, 2)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := 0; i < 6; i++ {
		s.run(t, randomCall(t, m, rng, i%m.NLayer, 4))
	}
	st := s.disp.Stats()
	if st.Caught != 1 || st.QuorumDisputes == 0 || st.QuorumLocal == 0 {
		t.Fatalf("stats %+v", st)
	}
	if w, ok := workerByID(st, liar); !ok || w.Connected || w.Mismatches == 0 {
		t.Fatalf("liar %+v", w)
	}
}

// TestQuorumArbiter: a backbone that computes nothing (backbone-only):
// a liar among three holders is outvoted by a third holder's RESULT and
// caught, outputs bit-identical; with the liar gone and only one holder
// left the call waits for a second one and fails with ErrNoHolder.
func TestQuorumArbiter(t *testing.T) {
	m := testModel()
	s := newStack(t, m, 0, quorumCfg(func(c *dispatch.Config) {
		c.LocalHeld = func(l, e int) bool { return false }
		c.HolderWait = 500 * time.Millisecond
	}))
	_, stopA := s.startHolder(t, newFake(m), 0, 1, 2, 3)
	s.startHolder(t, newFake(m), 0, 1, 2, 3)
	liar, _ := s.startHolder(t, newScaled(m, 1e-3), 0, 1, 2, 3)
	s.waitWorkers(t, 3)
	rng := rand.New(rand.NewPCG(7, 8))
	for i := 0; i < 30 && s.disp.Stats().Caught == 0; i++ {
		if _, err := s.tryCall(t, randomCall(t, m, rng, i%m.NLayer, 4)); err != nil {
			t.Fatal(err)
		}
	}
	st := s.disp.Stats()
	if st.Caught != 1 || st.QuorumAsks == 0 || st.ExpertsLocal != 0 {
		t.Fatalf("stats %+v", st)
	}
	if w, ok := workerByID(st, liar); !ok || w.Connected {
		t.Fatalf("liar %+v", w)
	}
	for i := 0; i < 5; i++ {
		if _, err := s.tryCall(t, randomCall(t, m, rng, i%m.NLayer, 4)); err != nil {
			t.Fatal(err)
		}
	}
	stopA()
	waitUntil(t, 10*time.Second, "one holder left", func() bool { return len(s.disp.Stats().Workers) > 0 && s.disp.Coverage().MinReplicas == 1 })
	_, err := s.tryCall(t, randomCall(t, m, rng, 0, 2))
	var me *dispatch.MissingError
	if !errors.Is(err, dispatch.ErrNoHolder) || !errors.As(err, &me) {
		t.Fatalf("one holder under quorum: %v", err)
	}
}

// TestQuorumColludersAudited: two holders that agree on the same wrong
// outputs (colluders) pass the quorum itself; with audits (CheckRate 1
// here) the agreed outputs are compared with the backbone's, the outputs
// stay bit-identical and both are caught. Without audits (CheckRate off)
// their lie is used: what c colluding holders can do (docs/accounting.md).
func TestQuorumColludersAudited(t *testing.T) {
	m := testModel()
	liar := func() *scaled { return newScaled(m, 1e-3) }
	s := newStack(t, m, 0, quorumCfg(func(c *dispatch.Config) { c.CheckRate = 1 }))
	s.startHolder(t, liar(), 0, 1, 2, 3)
	s.startHolder(t, liar(), 0, 1, 2, 3)
	s.waitWorkers(t, 2)
	rng := rand.New(rand.NewPCG(9, 10))
	s.run(t, randomCall(t, m, rng, 1, 4))
	if st := s.disp.Stats(); st.Caught != 2 || st.QuorumAudits == 0 || st.ExpertsRemote != 0 {
		t.Fatalf("stats %+v", st)
	}

	s2 := newStack(t, m, 0, quorumCfg(func(c *dispatch.Config) { c.CheckRate = -1 }))
	s2.startHolder(t, liar(), 0, 1, 2, 3)
	s2.startHolder(t, liar(), 0, 1, 2, 3)
	s2.waitWorkers(t, 2)
	c := randomCall(t, m, rng, 1, 4)
	out := make([]float32, len(c.want))
	if err := s2.disp.ComputeExperts(t.Context(), c.layer, c.hidden, c.ids, c.n, c.k, out); err != nil {
		t.Fatal(err)
	}
	if fbits(out[0]) == fbits(c.want[0]) || s2.disp.Stats().Caught != 0 {
		t.Fatal("two agreeing colluders without audits: expected their (wrong) outputs to be used, unnoticed")
	}
}

// TestVerifyMode: the policy's names, the default, and a refused one.
func TestVerifyMode(t *testing.T) {
	for in, want := range map[string]dispatch.VerifyMode{"": dispatch.VerifySpot, "spot": dispatch.VerifySpot, "quorum": dispatch.VerifyQuorum} {
		if got, err := dispatch.ParseVerifyMode(in); err != nil || got != want {
			t.Fatalf("%q: %q %v", in, got, err)
		}
	}
	if _, err := dispatch.ParseVerifyMode("majority"); err == nil {
		t.Fatal("majority accepted")
	}
	m := testModel()
	if _, err := dispatch.New(dispatch.Config{Model: m, Fallback: newFake(m), Verify: "x"}); err == nil {
		t.Fatal("New accepted Verify x")
	}
	d, err := dispatch.New(dispatch.Config{Model: m, Fallback: newFake(m)})
	if err != nil || d.Verify() != dispatch.VerifySpot || d.Coverage().Verify != dispatch.VerifySpot {
		t.Fatalf("default: %v", err)
	}
}

// TestQuorumLateHolderAskedAgain: a backbone that computes nothing, two
// honest holders under quorum (the real defaults: HolderWait 30 s,
// MinDeadline 50 ms). One holder answers one call past its deadline: that
// opinion is lost, no third key exists, and the call asks the late holder
// again (its first ask gave no opinion) instead of waiting HolderWait for
// a new holder; the outputs are bit-identical.
func TestQuorumLateHolderAskedAgain(t *testing.T) {
	m := testModel()
	s := newStack(t, m, 0, func(c *dispatch.Config) {
		c.Verify = dispatch.VerifyQuorum
		c.LocalHeld = func(l, e int) bool { return false }
	})
	late := newFake(m)
	s.startHolder(t, late, 0, 1, 2, 3)
	s.startHolder(t, newFake(m), 0, 1, 2, 3)
	s.waitWorkers(t, 2)
	rng := rand.New(rand.NewPCG(9, 10))
	for i := range 8 { // latency samples: the deadline settles at its 50 ms floor
		s.run(t, randomCall(t, m, rng, i%m.NLayer, 2))
	}
	late.slow.Store(int64(300 * time.Millisecond))
	go func() {
		time.Sleep(100 * time.Millisecond) // only the first ask is late
		late.slow.Store(0)
	}()
	el, err := s.tryCall(t, randomCall(t, m, rng, 0, 2))
	if err != nil {
		t.Fatalf("a late holder under quorum: %v after %v", err, el)
	}
	if st := s.disp.Stats(); st.ExpertsLocal != 0 || st.QuorumAsks == 0 {
		t.Fatalf("local outputs %d, further asks %d", st.ExpertsLocal, st.QuorumAsks)
	}
	if el > 10*time.Second {
		t.Fatalf("the call took %v: it waited for a new holder", el)
	}
}

// TestQuorumPrefersCPUBits: under quorum a CPU holder and a GPU holder
// (answers within the tolerance, not the bits) agree; the CPU holder's
// exact outputs are the ones used, whichever answered first, so the
// outputs stay bit-identical with a GPU in the pair, and nobody is caught.
func TestQuorumPrefersCPUBits(t *testing.T) {
	m := testModel()
	s := newStack(t, m, 0, quorumCfg(nil))
	s.startHolder(t, newFake(m), 0, 1, 2, 3)
	s.startInProc(t, newScaled(m, 1e-4), holdings(m, 0, 1, 2, 3), backend("cuda-test"))
	s.waitWorkers(t, 2)
	rng := rand.New(rand.NewPCG(9, 10))
	for i := 0; i < 20; i++ {
		s.run(t, randomCall(t, m, rng, i%m.NLayer, 1+i%4)) // bit-identical to the CPU's
	}
	st := s.disp.Stats()
	if st.Caught != 0 || st.QuorumAgreed == 0 || st.ExpertsRemote == 0 {
		t.Fatalf("stats %+v", st)
	}
}
