package dispatch_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// TestLayerCoverage: Coverage.Layers follows the workers as they join,
// leave and are banned. The backbone computes layers 0 and 3 itself;
// worker A holds layers 0-1, B layers 1-2, C (a liar) layers 2-3 and D
// experts 0-3 of layer 1. Each row below is worked out by hand from those
// holdings (8 experts per layer).
func TestLayerCoverage(t *testing.T) {
	m := testModel()
	s := newStack(t, m, 0, func(c *dispatch.Config) {
		c.LocalHeld = holdsLayers(0, 3)
		c.Probation, c.CheckRate = 100, -1 // every result of a new worker is checked where the backbone can compute it
	})
	_, stopA := s.startWorker(t, newFake(m), 0, 1)
	s.startWorker(t, newFake(m), 1, 2)
	s.startInProc(t, newScaled(m, 0.01), holdings(m, 2, 3), backend("cpu"))
	var partial []wire.Holding
	for e := range 4 {
		partial = append(partial, wire.Holding{Layer: 1, Expert: uint32(e)})
	}
	s.startWorkerWith(t, newFake(m), partial)
	s.waitWorkers(t, 4)

	type row struct{ holders, held, local, missing, min [4]int }
	layers := func() row {
		var r row
		for l, lc := range s.disp.Coverage().Layers {
			r.holders[l], r.held[l], r.local[l], r.missing[l], r.min[l] = lc.Holders, lc.Held, lc.Local, lc.Missing, lc.MinHolders
		}
		return r
	}
	expect := func(what string, want row) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		got := layers()
		for ; got != want && time.Now().Before(deadline); got = layers() {
			time.Sleep(10 * time.Millisecond)
		}
		if got != want {
			t.Fatalf("%s: layers %+v, want %+v", what, got, want)
		}
		if n := len(s.disp.Coverage().Layers); n != m.NLayer {
			t.Fatalf("%s: %d layers, want %d", what, n, m.NLayer)
		}
	}
	expect("four workers", row{
		holders: [4]int{1, 3, 2, 1}, held: [4]int{8, 8, 8, 8}, local: [4]int{8, 0, 0, 8},
		missing: [4]int{0, 0, 0, 0}, min: [4]int{1, 2, 2, 1}})

	stopA()
	expect("A left", row{
		holders: [4]int{0, 2, 2, 1}, held: [4]int{0, 8, 8, 8}, local: [4]int{8, 0, 0, 8},
		missing: [4]int{0, 0, 0, 0}, min: [4]int{0, 1, 2, 1}})

	// Calls on layer 3 (which the backbone can check) until the liar is
	// caught: its key is banned and its session closed.
	rng := rand.New(rand.NewPCG(81, 82))
	for i := 0; s.disp.Stats().Caught == 0; i++ {
		if i == 50 {
			t.Fatal("the liar was not caught in 50 calls")
		}
		s.run(t, randomCall(t, m, rng, 3, 8))
	}
	want := row{holders: [4]int{0, 2, 1, 0}, held: [4]int{0, 8, 8, 0}, local: [4]int{8, 0, 0, 8},
		missing: [4]int{0, 0, 0, 0}, min: [4]int{0, 1, 1, 0}}
	expect("C banned", want)
	time.Sleep(300 * time.Millisecond) // C retries (BackoffMax 200 ms) and is refused
	if st := s.disp.Stats(); st.RefusedBanned == 0 {
		t.Fatalf("the banned worker did not retry: %+v", st)
	}
	if got := layers(); got != want {
		t.Fatalf("after the banned key's retries: %+v, want %+v", got, want)
	}
}
