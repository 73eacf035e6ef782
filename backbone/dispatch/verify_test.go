package dispatch_test

import (
	"context"
	"crypto/ed25519"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/kvasir-ai/kvasir/backbone/credit"
	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/backbone/hub"
	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/wire"
	"github.com/kvasir-ai/kvasir/engine/worker"
)

// ledgerStack is newStack with a SQLite ledger as the hub's meter and
// creditable bytes held for an hour (nothing settles before a session
// ends), so a forfeit covers everything a session earned.
func ledgerStack(t *testing.T, m dispatch.Model, mod func(*dispatch.Config)) (*stack, *ledger.Ledger) {
	t.Helper()
	l, err := ledger.Open(filepath.Join(t.TempDir(), "ledger.sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	s := newStackHub(t, m, 0, mod, func(c *hub.Config) { c.Meter = l; c.SettleDelay = time.Hour })
	return s, l
}

// endSessions closes the dispatcher (its links carry every verdict before
// their close), waits until the hub has ended every session, and returns
// what the gateway's crediting makes of the ledger: nKVR per worker id, at
// the default rate.
func endSessions(t *testing.T, s *stack, l *ledger.Ledger) map[string]uint64 {
	t.Helper()
	s.disp.Close()
	waitUntil(t, 10*time.Second, "every hub session to end", func() bool {
		for _, ss := range s.hub.Sessions() {
			if !ss.Ended {
				return false
			}
		}
		return true
	})
	svc, err := credit.Open(credit.Config{Path: filepath.Join(t.TempDir(), "wallets.sqlite"), Source: l})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	if _, err := svc.Credit(context.Background()); err != nil {
		t.Fatal(err)
	}
	ws, err := svc.Wallets()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, w := range ws {
		out[w.Worker] = w.NKVR
	}
	return out
}

// ledgerOf returns worker id's creditable and rejected bytes in l.
func ledgerOf(t *testing.T, l *ledger.Ledger, id string) (bytes, rejected uint64) {
	t.Helper()
	tot, err := l.Totals()
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range tot {
		if w.ID == id {
			return w.Bytes, w.RejectedBytes
		}
	}
	return 0, 0
}

// TestLyingWorkerFixtureDecode: an honest and an always-lying worker
// process hold every expert of the fixture model. The liar's first result
// is checked (probation), caught, replaced by the local outputs; its
// session is forfeited and closed and its key banned (it is refused when it
// reconnects, also by the ban file). The greedy decode equals the local one
// bit for bit, and the gateway credits the liar nothing.
func TestLyingWorkerFixtureDecode(t *testing.T) {
	const name = "tiny-qwen3moe-Q8_0.gguf"
	p, wantLogits, wantToks := localDecode(t, name, 6)
	bb, md, own := fixtureBackbone(t, name)
	banFile := filepath.Join(t.TempDir(), "bans.json")
	s, l := ledgerStack(t, md, func(c *dispatch.Config) {
		own(c)
		c.Probation, c.CheckRate = 0, 0 // the defaults
		c.BanFile = banFile
	})
	honestKey, honestID := newKey()
	liarKey, liarID := newKey()
	honest := s.startTrustChild(t, childEnv(honestKey, "fixture:"+name), true)
	liar := s.startTrustChild(t, childEnv(liarKey, "fixture:"+name, "KVASIR_LIE", "always"), true)
	s.waitWorkers(t, 2)
	gotLogits, gotToks := s.swarmDecode(t, bb, wantToks)
	sameLogits(t, gotLogits, wantLogits)
	st := s.disp.Stats()
	if st.Caught != 1 || st.Mismatches != 1 || liar.lies.Load() != 1 {
		t.Fatalf("caught %d mismatches %d, liar lied %d times; want 1 1 1", st.Caught, st.Mismatches, liar.lies.Load())
	}
	total := uint64((len(fixturePrompt) + 5) * p.ExpertsUsed * p.Layers)
	if st.ExpertsLocal+st.ExpertsRemote != total || st.ExpertsLocal == 0 || st.ExpertsLocal > total/2 {
		t.Fatalf("experts local %d remote %d of %d", st.ExpertsLocal, st.ExpertsRemote, total)
	}
	waitUntil(t, 10*time.Second, "the liar's reconnection to be refused", func() bool {
		l, ok := liar.said("REFUSED")
		return ok && strings.Contains(l, "banned")
	})
	if st := s.disp.Stats(); st.RefusedBanned == 0 || st.Banned != 1 {
		t.Fatalf("refused banned %d, banned %d", st.RefusedBanned, st.Banned)
	}
	bans, err := dispatch.OpenBans(banFile) // what a restarted backbone reads
	if err != nil {
		t.Fatal(err)
	}
	if b, ok := bans.Banned(liarID, time.Now()); !ok || !strings.Contains(b.Reason, "verification failed") ||
		b.Until.Sub(b.Since) != dispatch.DefaultBanFor {
		t.Fatalf("ban file: %+v %v", b, ok)
	}
	if _, ok := bans.Banned(honestID, time.Now()); ok {
		t.Fatal("the honest worker is banned")
	}
	// The liar's session is forfeited (its requests' bytes, answered by
	// a lie, were never creditable: a DISPATCH is paid with an accepted
	// answer only, so there may be nothing left to forfeit).
	var forfeited uint64
	forfeitedSession := false
	for _, ss := range s.hub.Sessions() {
		if ss.WorkerID == liarID {
			forfeited += ss.Forfeited
			forfeitedSession = forfeitedSession || strings.Contains(ss.ForfeitReason, "verification failed")
		}
	}
	nkvr := endSessions(t, s, l)
	lb, lrej := ledgerOf(t, l, liarID)
	hb, _ := ledgerOf(t, l, honestID)
	if nkvr[liarID] != 0 || lb != 0 || lrej == 0 || !forfeitedSession || nkvr[honestID] == 0 || hb == 0 {
		t.Fatalf("liar: %d nKVR, ledger %d creditable %d rejected (%d forfeited, session forfeited %v); honest: %d nKVR, ledger %d",
			nkvr[liarID], lb, lrej, forfeited, forfeitedSession, nkvr[honestID], hb)
	}
	t.Logf("tokens %v identical; %d outputs remote, %d local; liar forfeited %d bytes, credited 0; honest credited %d nKVR (%d computations)",
		gotToks, st.ExpertsRemote, st.ExpertsLocal, forfeited, nkvr[honestID], honest.computing.Load())
}

// TestLiarAfterProbation: a worker process that is honest through its
// probation and then corrupts 1 result in 20 is caught by the random
// checks (here 1 in 4, to keep the test short), and every lie that
// slipped through is accounted for: an output the call returned differs
// from the reference exactly when the worker lied and the lie was not
// checked. Its session is forfeited; a new dispatcher with the same ban
// file refuses the key.
func TestLiarAfterProbation(t *testing.T) {
	m := testModel()
	banFile := filepath.Join(t.TempDir(), "bans.json")
	const probation, every = 4, 20
	s, l := ledgerStack(t, m, func(c *dispatch.Config) {
		c.Probation, c.CheckRate, c.BanFile = probation, 0.25, banFile
	})
	key, id := newKey()
	env := childEnv(key, fakeSpec(m), "KVASIR_LIE", "after:4:every:20")
	liar := s.startTrustChild(t, env, true)
	s.waitWorkers(t, 1)
	rng := rand.New(rand.NewPCG(61, 62))
	wrong, calls := 0, 0
	for ; calls < 4000 && s.disp.Stats().Caught == 0; calls++ {
		c := randomCall(t, m, rng, calls%m.NLayer, 3)
		out := make([]float32, len(c.want))
		if err := s.disp.ComputeExperts(context.Background(), c.layer, c.hidden, c.ids, c.n, c.k, out); err != nil {
			t.Fatal(err)
		}
		for i := range out {
			if fbits(out[i]) != fbits(c.want[i]) {
				wrong++
				break
			}
		}
	}
	st := s.disp.Stats()
	lies := int(liar.lies.Load())
	if st.Caught != 1 || st.Mismatches != 1 || lies < 1 || wrong != lies-1 {
		t.Fatalf("after %d calls: caught %d mismatches %d; %d lies, %d wrong outputs (want lies-1)", calls, st.Caught, st.Mismatches, lies, wrong)
	}
	for _, ws := range st.Workers {
		if ws.ID != id || !strings.Contains(ws.Reason, "verification failed") || ws.Checks < probation || ws.Mismatches != 1 {
			t.Fatalf("worker stats %+v", ws)
		}
	}
	t.Logf("caught after %d results (%d checked): %d lies, %d slipped through (expected (1-p)/p = 3)", calls, st.Checks, lies, lies-1)
	nkvr := endSessions(t, s, l)
	if b, rej := ledgerOf(t, l, id); nkvr[id] != 0 || b != 0 || rej == 0 {
		t.Fatalf("liar credited %d nKVR, ledger %d creditable %d rejected", nkvr[id], b, rej)
	}
	_ = liar.cmd.Process.Kill()
	_ = liar.cmd.Wait()

	// A restarted backbone (a new dispatcher, hub and gateway) reads the
	// ban file and refuses the same key.
	s2 := newStack(t, m, 0, func(c *dispatch.Config) { c.BanFile = banFile })
	again := s2.startTrustChild(t, env, false)
	waitUntil(t, 20*time.Second, "the banned key to be refused after the restart", func() bool {
		l, ok := again.said("REFUSED")
		return ok && strings.Contains(l, "banned until")
	})
	if st := s2.disp.Stats(); st.RefusedBanned == 0 || len(st.Workers) != 0 {
		t.Fatalf("restarted dispatcher: refused %d, workers %+v", st.RefusedBanned, st.Workers)
	}
}

// TestForgedResult: a worker process that answers a RESULT for a request
// it was never sent has its session forfeited and closed with the reason,
// and its key banned; the gateway credits it nothing, although its one
// honest answer was used.
func TestForgedResult(t *testing.T) {
	m := testModel()
	s, l := ledgerStack(t, m, nil)
	key, id := newKey()
	forger := s.startTrustChild(t, childEnv(key, fakeSpec(m), "KVASIR_FORGE", "1"), true)
	s.waitWorkers(t, 1)
	s.run(t, randomCall(t, m, rand.New(rand.NewPCG(63, 64)), 2, 4))
	waitUntil(t, 10*time.Second, "the forger's session to close", func() bool { _, ok := forger.said("CLOSED"); return ok })
	closed, _ := forger.said("CLOSED")
	if !strings.HasPrefix(closed, "CLOSED 1008 ") || !strings.Contains(closed, "never sent") || !strings.Contains(closed, "forfeited") {
		t.Fatalf("forger: %q", closed)
	}
	st := s.disp.Stats()
	if st.Caught != 1 || st.ExpertsRemote != 8 || st.Banned != 1 {
		t.Fatalf("caught %d remote %d banned %d", st.Caught, st.ExpertsRemote, st.Banned)
	}
	nkvr := endSessions(t, s, l)
	if b, rej := ledgerOf(t, l, id); nkvr[id] != 0 || b != 0 || rej < uint64(wire.DispatchSize(4, m.D, m.K)) {
		t.Fatalf("forger credited %d nKVR, ledger %d creditable %d rejected", nkvr[id], b, rej)
	}
}

// TestReplicaTakesOverKilledWorker: two worker processes hold the same
// experts; one is SIGKILLed while it computes its part of a call. Its
// pairs go to the other (a replica request, checked for free against the
// probation reference) and the call is served entirely remotely.
func TestReplicaTakesOverKilledWorker(t *testing.T) {
	m := testModel()
	const maxDL = 3 * time.Second
	s, fast, fastID := killedReplicaStack(t, m, maxDL)
	const rows = 16
	el := s.run(t, randomCall(t, m, rand.New(rand.NewPCG(65, 66)), 1, rows))
	st := s.disp.Stats()
	if st.ExpertsLocal != 0 || st.ExpertsRemote != rows*uint64(m.K) || st.Failovers == 0 || st.ReplicaPairs == 0 || el > maxDL {
		t.Fatalf("in %v: local %d remote %d failovers %d replica pairs %d", el, st.ExpertsLocal, st.ExpertsRemote, st.Failovers, st.ReplicaPairs)
	}
	for _, w := range st.Workers {
		if w.ID == fastID && (w.Requests != 2 || w.Checks != 2 || w.Mismatches != 0) {
			t.Fatalf("replica: %+v", w)
		}
	}
	t.Logf("call done in %v: %d pairs served by the replica after the kill (%d computations there)", el, st.ReplicaPairs, fast.computing.Load())
}

// TestFrameSplitAt64MiB: d = 2048, top-8: a RESULT of 8191 outputs
// (67,076,116 bytes) fits one frame, 8192 (64 MiB + 20 bytes) do not. A
// worker process holding every expert serves a 1023-row call in one
// request and a 1024-row call in two, bit-identical and fully remote.
func TestFrameSplitAt64MiB(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 128 MiB through TLS")
	}
	m := dispatch.Model{ID: "fake-moe", D: 2048, K: 8, NLayer: 1, NExpert: 16}
	if got := wire.ResultSize(8191, m.D); got > wire.MaxMessage || wire.ResultSize(8192, m.D) <= wire.MaxMessage {
		t.Fatalf("boundary moved: %d", got)
	}
	s := newStack(t, m, 0, func(c *dispatch.Config) { c.MaxDeadline = 2 * time.Minute })
	key, _ := newKey()
	s.startTrustChild(t, childEnv(key, fakeSpec(m), "KVASIR_LAYERS", "0"), true)
	s.waitWorkers(t, 1)
	rng := rand.New(rand.NewPCG(67, 68))
	s.run(t, randomCall(t, m, rng, 0, 1023))
	if st := s.disp.Stats(); st.Splits != 0 || st.ExpertsRemote != 1023*8 || st.Workers[0].Requests != 1 {
		t.Fatalf("1023 rows: splits %d remote %d requests %d", st.Splits, st.ExpertsRemote, st.Workers[0].Requests)
	}
	s.run(t, randomCall(t, m, rng, 0, 1024))
	st := s.disp.Stats()
	if st.Splits != 1 || st.ExpertsLocal != 0 || st.ExpertsRemote != 2047*8 || st.Workers[0].Requests != 3 || st.Workers[0].Results != 3 {
		t.Fatalf("1024 rows: splits %d local %d remote %d requests %d results %d", st.Splits, st.ExpertsLocal,
			st.ExpertsRemote, st.Workers[0].Requests, st.Workers[0].Results)
	}
}

// scaled is a computer whose outputs are fake's times (1 + rel).
type scaled struct {
	fakeExperts
	rel float32
}

// newScaled returns the scaled computer for m's shapes (every expert held).
func newScaled(m dispatch.Model, rel float32) *scaled {
	return &scaled{fakeExperts: fakeExperts{d: m.D, nExpert: m.NExpert}, rel: rel}
}

func (c *scaled) ComputeExperts(ctx context.Context, layer int, hidden []float32, ids []int32, n, k int, out []float32) error {
	if err := c.fakeExperts.ComputeExperts(ctx, layer, hidden, ids, n, k, out); err != nil {
		return err
	}
	for i := range out {
		out[i] *= 1 + c.rel
	}
	return nil
}

// TestBackendTolerance: a declared non-CPU backend is held to the stated
// relative bound per output row (its outputs are used as they are), a CPU
// backend to exact bits (one ulp is a lie), and with a negative Tolerance
// only CPU backends are accepted.
func TestBackendTolerance(t *testing.T) {
	m := testModel()
	rng := rand.New(rand.NewPCG(69, 70))
	compute := func(s *stack, c call) []float32 {
		out := make([]float32, len(c.want))
		if err := s.disp.ComputeExperts(context.Background(), c.layer, c.hidden, c.ids, c.n, c.k, out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	// checked is a stack checking every result (a probation of 100, no
	// random checks) with one worker serving every expert with comp and
	// declaring backend b.
	checked := func(t *testing.T, comp expert.Computer, b string) *stack {
		s := newStack(t, m, 0, func(c *dispatch.Config) { c.Probation, c.CheckRate = 100, -1 })
		s.startInProc(t, comp, holdings(m, 0, 1, 2, 3), backend(b))
		s.waitWorkers(t, 1)
		return s
	}
	t.Run("gpu-within-bound", func(t *testing.T) {
		s := checked(t, newScaled(m, 1e-4), "cuda-test")
		for i := 0; i < 5; i++ {
			c := randomCall(t, m, rng, i%m.NLayer, 4)
			out := compute(s, c)
			for j := range out {
				if d := math.Abs(float64(out[j] - c.want[j])); d > 2e-4*math.Abs(float64(c.want[j]))+1e-6 {
					t.Fatalf("out[%d] = %v, want %v within 1e-4", j, out[j], c.want[j])
				}
			}
		}
		st := s.disp.Stats()
		if st.Checks != 5 || st.Mismatches != 0 || st.ExpertsRemote != 40 || st.Workers[0].Tolerance != dispatch.DefaultTolerance {
			t.Fatalf("checks %d mismatches %d remote %d worker %+v", st.Checks, st.Mismatches, st.ExpertsRemote, st.Workers[0])
		}
	})
	t.Run("gpu-beyond-bound", func(t *testing.T) {
		s := checked(t, newScaled(m, 0.01), "cuda-test")
		s.run(t, randomCall(t, m, rng, 0, 4)) // the reference replaces the result: bit-identical
		if st := s.disp.Stats(); st.Mismatches != 1 || st.Caught != 1 || st.ExpertsLocal != 8 {
			t.Fatalf("mismatches %d caught %d local %d", st.Mismatches, st.Caught, st.ExpertsLocal)
		}
	})
	t.Run("cpu-one-ulp", func(t *testing.T) {
		s := checked(t, newScaled(m, 1e-7), "cpu")
		s.run(t, randomCall(t, m, rng, 0, 4))
		if st := s.disp.Stats(); st.Mismatches != 1 || st.Caught != 1 {
			t.Fatalf("mismatches %d caught %d", st.Mismatches, st.Caught)
		}
	})
	t.Run("cpu-only", func(t *testing.T) {
		s := newStack(t, m, 0, func(c *dispatch.Config) { c.Tolerance = -1 })
		w := s.startInProc(t, newFake(m), holdings(m, 0, 1, 2, 3), backend("metal")).Worker
		waitUntil(t, 10*time.Second, "the refusal", func() bool {
			return strings.Contains(w.Stats().LastError, "not a CPU backend")
		})
		if st := s.disp.Stats(); len(st.Workers) != 0 {
			t.Fatalf("workers %+v", st.Workers)
		}
	})
}

// TestCaughtClosesSameKeySessions: two sessions of one key (an honest one
// and a lying one); when the liar is caught, both are forfeited and
// closed, and neither comes back.
func TestCaughtClosesSameKeySessions(t *testing.T) {
	m := testModel()
	s := newStackHub(t, m, 0, func(c *dispatch.Config) { c.Probation, c.CheckRate = 100, -1 },
		func(c *hub.Config) { c.SettleDelay = time.Hour })
	_, key, _ := ed25519.GenerateKey(nil)
	sameKey := func(c *worker.Config) { c.Key, c.Backend = key, "cpu" }
	s.startInProc(t, newFake(m), holdings(m, 0, 1, 2, 3), sameKey)
	s.startInProc(t, newScaled(m, 0.01), holdings(m, 0, 1, 2, 3), sameKey)
	s.waitWorkers(t, 2)
	rng := rand.New(rand.NewPCG(73, 74))
	for i := 0; s.disp.Stats().Caught == 0 && i < 50; i++ {
		s.run(t, randomCall(t, m, rng, i%m.NLayer, 8))
	}
	// Both end forfeited, nothing creditable left (what the honest one had
	// earned and not settled is forfeited; the liar's requests, answered
	// by a lie, were never creditable).
	waitUntil(t, 10*time.Second, "both sessions to end forfeited", func() bool {
		n := 0
		for _, ss := range s.hub.Sessions() { // later ones: refused reconnections
			if ss.Ended && ss.ForfeitReason != "" && ss.CreditIn+ss.CreditOut == 0 {
				n++
			}
		}
		return n == 2
	})
	time.Sleep(300 * time.Millisecond) // the workers retry (BackoffMax 200 ms) and are refused
	if st := s.disp.Stats(); st.Caught != 1 || st.RefusedBanned == 0 || len(st.Workers) != 2 || st.Workers[0].Connected || st.Workers[1].Connected {
		t.Fatalf("caught %d refused %d workers %+v", st.Caught, st.RefusedBanned, st.Workers)
	}
}

// TestForfeitAfterWorkerLeft: a worker sends a wrong RESULT and
// disconnects at once, while the backbone is still computing the
// reference. The hub keeps the link open for the verdict (drain), so the
// FORFEIT that follows the comparison still reaches it: the session's
// bytes are never credited.
func TestForfeitAfterWorkerLeft(t *testing.T) {
	m := testModel()
	s, l := ledgerStack(t, m, func(c *dispatch.Config) { c.Probation, c.CheckRate = 0, 0 })
	s.local.delay = 300 * time.Millisecond // the reference takes a while
	c := s.rawWorker(t)
	lim := &wire.Limits{D: m.D, K: m.K, NLayer: m.NLayer, NExpert: m.NExpert}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.run(t, randomCall(t, m, rand.New(rand.NewPCG(75, 76)), 0, 4)) // the reference is used
	}()
	d := readDispatch(t, c, lim)
	r := &wire.Result{Request: d.Request, M: 8, D: m.D, Out: make([]float32, 8*m.D)} // zeros: wrong
	if err := c.Write(context.Background(), websocket.MessageBinary, r.Append(nil)); err != nil {
		t.Fatal(err)
	}
	c.Close(websocket.StatusNormalClosure, "bye")
	<-done
	var id string
	waitUntil(t, 10*time.Second, "the session to end", func() bool {
		ss := s.hub.Sessions()
		if len(ss) == 1 {
			id = ss[0].WorkerID
		}
		return len(ss) == 1 && ss[0].Ended
	})
	ss := s.hub.Sessions()[0]
	if st := s.disp.Stats(); st.Caught != 1 || ss.ForfeitReason == "" || ss.CreditOut+ss.CreditIn != 0 {
		t.Fatalf("caught %d; hub session %+v", st.Caught, ss)
	}
	if b, rej := ledgerOf(t, l, id); b != 0 || rej == 0 {
		t.Fatalf("ledger %d creditable %d rejected", b, rej)
	}
}
