package dispatch_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// capacityStack is a stack whose backbone computes no expert itself
// (LocalHeld false everywhere, as with a backbone-only model holding no hot
// expert), with every result checked (probation and rate 1).
func capacityStack(t *testing.T, wait time.Duration, mod func(*dispatch.Config)) *stack {
	t.Helper()
	m := testModel()
	return newStack(t, m, 0, func(c *dispatch.Config) {
		c.LocalHeld = func(l, e int) bool { return false }
		c.HolderWait = wait
		c.Probation, c.CheckRate = 1000, 1
		c.MaxDeadline = 3 * time.Second
		if mod != nil {
			mod(c)
		}
	})
}

func workerByID(st dispatch.Stats, id string) (dispatch.WorkerStats, bool) {
	for _, w := range st.Workers {
		if w.ID == id {
			return w, true
		}
	}
	return dispatch.WorkerStats{}, false
}

// TestCapacityReplicasVerify: with no local copy, checked requests go to
// two holders and their outputs are compared; honest replicas agree, every
// output is remote and bit-identical, and Fallback is never called.
func TestCapacityReplicasVerify(t *testing.T) {
	s := capacityStack(t, 2*time.Second, nil)
	m := s.model
	a, _ := s.startHolder(t, newFake(m), 0, 1, 2, 3)
	b, _ := s.startHolder(t, newFake(m), 0, 1, 2, 3)
	s.waitWorkers(t, 2)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 8 {
		if _, err := s.tryCall(t, randomCall(t, m, rng, i%m.NLayer, 5)); err != nil {
			t.Fatal(err)
		}
	}
	st := s.disp.Stats()
	if s.local.calls.Load() != 0 || st.ExpertsLocal != 0 || st.ExpertsRemote != 8*5*uint64(m.K) {
		t.Fatalf("fallback calls %d, local %d, remote %d", s.local.calls.Load(), st.ExpertsLocal, st.ExpertsRemote)
	}
	if st.CrossChecks == 0 || st.Disputes != 0 || st.Mismatches != 0 {
		t.Fatalf("cross checks %d, disputes %d, mismatches %d", st.CrossChecks, st.Disputes, st.Mismatches)
	}
	for _, id := range []string{a, b} {
		if w, ok := workerByID(st, id); !ok || w.Checks == 0 || !w.Connected {
			t.Fatalf("worker %s: %+v", id[:8], w)
		}
	}
	cv := s.disp.Coverage()
	if cv.Experts != m.NLayer*m.NExpert || cv.Local != 0 || cv.Missing != 0 || cv.MinReplicas != 2 || cv.ByReplicas[2] != cv.Experts {
		t.Fatalf("coverage %+v", cv)
	}
}

// TestCapacityLiarOutvoted: three holders, one returns wrong outputs. Its
// twin disagrees, the third holder decides: the liar is caught (banned, its
// session closed) and every output is right.
func TestCapacityLiarOutvoted(t *testing.T) {
	s := capacityStack(t, 3*time.Second, nil)
	m := s.model
	s.startHolder(t, newFake(m), 0, 1, 2, 3)
	s.startHolder(t, newFake(m), 0, 1, 2, 3)
	liar, _ := s.startHolder(t, newScaled(m, 1e-6), 0, 1, 2, 3)
	s.waitWorkers(t, 3)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 12 {
		if _, err := s.tryCall(t, randomCall(t, m, rng, i%m.NLayer, 6)); err != nil {
			t.Fatal(err)
		}
	}
	st := s.disp.Stats()
	w, _ := workerByID(st, liar)
	if st.Disputes == 0 || st.Mismatches == 0 || st.Caught != 1 || w.Connected || w.Mismatches == 0 {
		t.Fatalf("disputes %d mismatches %d caught %d; liar %+v", st.Disputes, st.Mismatches, st.Caught, w)
	}
	if _, banned := s.disp.Bans().Banned(liar, time.Now()); !banned {
		t.Fatal("the liar is not banned")
	}
	if s.local.calls.Load() != 0 {
		t.Fatalf("fallback called %d times", s.local.calls.Load())
	}
}

// TestCapacityDisputeUndecided: two holders that disagree and no third:
// the call waits HolderWait and fails (never a guessed output); nobody is
// banned. When a third holder joins during the wait, it decides.
func TestCapacityDisputeUndecided(t *testing.T) {
	s := capacityStack(t, 300*time.Millisecond, nil)
	m := s.model
	honest, _ := s.startHolder(t, newFake(m), 1)
	liar, _ := s.startHolder(t, newScaled(m, 0.5), 1)
	s.waitWorkers(t, 2)
	rng := rand.New(rand.NewPCG(5, 6))
	_, err := s.tryCall(t, randomCall(t, m, rng, 1, 4))
	var me *dispatch.MissingError
	if !errors.Is(err, dispatch.ErrNoHolder) || !errors.As(err, &me) || me.Disputed == 0 || me.Layer != 1 || me.Pairs != me.Disputed {
		t.Fatalf("undecided dispute: %v", err)
	}
	st := s.disp.Stats()
	if st.Caught != 0 || st.NoHolderFailures != 1 {
		t.Fatalf("caught %d, no-holder failures %d", st.Caught, st.NoHolderFailures)
	}
	for _, id := range []string{honest, liar} {
		if w, _ := workerByID(st, id); !w.Connected {
			t.Fatalf("%s closed on an undecided dispute", id[:8])
		}
	}

	s2 := capacityStack(t, 10*time.Second, nil)
	s2.startHolder(t, newFake(m), 1)
	liar2, _ := s2.startHolder(t, newScaled(m, 0.5), 1)
	s2.waitWorkers(t, 2)
	go func() {
		time.Sleep(300 * time.Millisecond)
		s2.startHolder(t, newFake(m), 1)
	}()
	start := time.Now()
	if _, err := s2.tryCall(t, randomCall(t, m, rng, 1, 4)); err != nil {
		t.Fatal(err)
	}
	st = s2.disp.Stats()
	if w, _ := workerByID(st, liar2); w.Connected || st.Caught != 1 || st.HolderWaits != 1 {
		t.Fatalf("after the third holder joined: caught %d, waits %d, liar %+v", st.Caught, st.HolderWaits, w)
	}
	t.Logf("dispute decided by a holder that joined after %v", time.Since(start).Round(time.Millisecond))
}

// TestCapacityWaitsForHolder: a pair no worker holds waits for a holder:
// the call fails with a *MissingError naming the layer and experts after
// HolderWait, and succeeds when a holder connects within it.
func TestCapacityWaitsForHolder(t *testing.T) {
	s := capacityStack(t, 250*time.Millisecond, nil)
	m := s.model
	s.startHolder(t, newFake(m), 0, 1)
	s.waitWorkers(t, 1)
	rng := rand.New(rand.NewPCG(7, 8))
	c := randomCall(t, m, rng, 2, 3)
	start := time.Now()
	_, err := s.tryCall(t, c)
	var me *dispatch.MissingError
	if !errors.As(err, &me) || me.Layer != 2 || me.Pairs != 3*m.K || len(me.Experts) == 0 || time.Since(start) < 250*time.Millisecond {
		t.Fatalf("no holder: %v after %v", err, time.Since(start))
	}
	if cv := s.disp.Coverage(); cv.Missing != 2*m.NExpert || cv.Covered != 2*m.NExpert || cv.MinReplicas != 0 {
		t.Fatalf("coverage %+v", cv)
	}
	if s.local.calls.Load() != 0 {
		t.Fatal("the fallback computed a pair it does not hold")
	}

	s2 := capacityStack(t, 10*time.Second, nil)
	s2.startHolder(t, newFake(m), 0, 1)
	s2.waitWorkers(t, 1)
	go func() {
		time.Sleep(200 * time.Millisecond)
		s2.startHolder(t, newFake(m), 2, 3)
	}()
	if _, err := s2.tryCall(t, randomCall(t, m, rng, 2, 3)); err != nil {
		t.Fatal(err)
	}
	if st := s2.disp.Stats(); st.HolderWaits != 1 || st.HolderWaitTime < 100*time.Millisecond || st.ExpertsLocal != 0 {
		t.Fatalf("waits %d for %v, local %d", st.HolderWaits, st.HolderWaitTime, st.ExpertsLocal)
	}
}

// TestCapacityLastHolderLeaves: the only holder of a layer dies while it
// computes a step: the step waits for a holder (no local recomputation)
// and is served by the next worker that connects; with none, it fails.
func TestCapacityLastHolderLeaves(t *testing.T) {
	for _, rejoin := range []bool{true, false} {
		wait := 400 * time.Millisecond
		if rejoin {
			wait = 10 * time.Second
		}
		s := capacityStack(t, wait, func(c *dispatch.Config) { c.Probation, c.CheckRate = -1, -1 })
		m := s.model
		comp := &fakeExperts{d: m.D, nExpert: m.NExpert, block: make(chan struct{})}
		var cancel func()
		comp.onCall = func() { go cancel() }
		_, cancel = s.startHolder(t, comp, 0, 1, 2, 3)
		s.waitWorkers(t, 1)
		if rejoin {
			go func() {
				time.Sleep(300 * time.Millisecond)
				s.startHolder(t, newFake(m), 0, 1, 2, 3)
			}()
		}
		_, err := s.tryCall(t, randomCall(t, m, rand.New(rand.NewPCG(9, 10)), 3, 4))
		switch {
		case rejoin && err != nil:
			t.Fatalf("with a new holder: %v", err)
		case !rejoin && !errors.Is(err, dispatch.ErrNoHolder):
			t.Fatalf("without a holder: %v", err)
		}
		if st := s.disp.Stats(); st.ExpertsLocal != 0 || s.local.calls.Load() != 0 {
			t.Fatalf("local %d", st.ExpertsLocal)
		}
	}
}

// TestOldProtocolRefused: a version 5 worker's HELLO (protocol before
// DISPATCH_SUM) is refused with a close naming both versions.
func TestOldProtocolRefused(t *testing.T) {
	s := newStack(t, testModel(), 0, nil)
	_, key, _ := ed25519.GenerateKey(nil)
	c, code, err := s.dialRaw(t, key, nil)
	if err != nil {
		t.Fatalf("dial: %d %v", code, err)
	}
	defer c.CloseNow()
	msg := (&wire.Hello{Key: key.Public().(ed25519.PublicKey), ModelID: s.model.ID}).Append(nil)
	msg[1], msg[2] = 6, 0 // a version 6 worker (before DISPATCH_SUM_DIGEST)
	if err := c.Write(context.Background(), websocket.MessageBinary, msg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _, err = c.Read(ctx)
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.StatusPolicyViolation ||
		!strings.Contains(ce.Reason, "protocol version 6, this backbone speaks 7") {
		t.Fatalf("old HELLO: %v", err)
	}
}

// TestDelegate: a layer no connected worker holds is handed back to the
// caller's own experts when they are the Fallback (expert.Delegator), and
// counted as a local call; a held layer, another Computer, an expert
// Fallback lacks, a bad id or a ragged ids are not.
func TestDelegate(t *testing.T) {
	m := testModel()
	lacks := func(layer, e int) bool { return !(layer == 2 && e == 5) }
	s := newStack(t, m, 0, func(c *dispatch.Config) { c.LocalHeld = lacks })
	s.startHolder(t, newFake(m), 0)
	s.waitWorkers(t, 1)
	ids := []int32{1, 2, 3, 4} // two rows of K = 2
	before := s.disp.Stats()
	// DelegatesLayer: layer 1 (no holder, Fallback holds all) only, and
	// only for Fallback; it counts nothing.
	for l := -1; l <= m.NLayer; l++ {
		if got, want := s.disp.DelegatesLayer(l, s.local), l == 1 || (l >= 3 && l < m.NLayer); got != want {
			t.Errorf("DelegatesLayer(%d) = %v, want %v", l, got, want)
		}
	}
	if s.disp.DelegatesLayer(1, newFake(m)) || s.disp.DelegatesLayer(1, nil) {
		t.Error("DelegatesLayer for another Computer")
	}
	if st := s.disp.Stats(); st.Calls != before.Calls {
		t.Fatalf("DelegatesLayer counted calls: %+v", st)
	}
	if !s.disp.Delegate(1, ids, s.local) {
		t.Fatal("layer 1 (no holder): not delegated")
	}
	st := s.disp.Stats()
	if st.Calls != before.Calls+1 || st.ExpertsLocal != before.ExpertsLocal+uint64(len(ids)) || st.ExpertsRemote != before.ExpertsRemote {
		t.Fatalf("stats after a delegated call: %+v (before %+v)", st, before)
	}
	for _, c := range []struct {
		name  string
		layer int
		ids   []int32
		own   expert.Computer
	}{
		{"held layer", 0, ids, s.local},
		{"another computer", 1, ids, newFake(m)},
		{"nil computer", 1, ids, nil},
		{"expert Fallback lacks", 2, []int32{4, 5}, s.local},
		{"expert id out of range", 1, []int32{1, int32(m.NExpert)}, s.local},
		{"negative expert id", 1, []int32{-1, 2}, s.local},
		{"ragged ids", 1, []int32{1, 2, 3}, s.local},
		{"no ids", 1, nil, s.local},
		{"layer out of range", m.NLayer, ids, s.local},
	} {
		if s.disp.Delegate(c.layer, c.ids, c.own) {
			t.Errorf("%s: delegated", c.name)
		}
	}
	if got := s.disp.Stats(); got.Calls != st.Calls || got.ExpertsLocal != st.ExpertsLocal {
		t.Fatalf("refused delegations counted: %+v", got)
	}
	// The same ids on the held layer go to the worker.
	c := randomCall(t, m, rand.New(rand.NewPCG(7, 8)), 0, 2)
	s.run(t, c)
	if got := s.disp.Stats(); got.ExpertsRemote == st.ExpertsRemote {
		t.Fatalf("held layer not computed remotely: %+v", got)
	}
}
