package model

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"
)

// TestTeam: every unit of every region runs exactly once, on a worker
// number in [0, threads), and the helpers are gone after stop.
func TestTeam(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, threads := range []int{1, 2, 5} {
		var tm team
		tm.start(threads)
		for region, n := range []int{0, 1, 2, 7, 1000, 3} {
			hits := make([]atomic.Int32, n)
			var badWorker atomic.Bool
			tm.run(n, func(w, u int) {
				if w < 0 || w >= threads {
					badWorker.Store(true)
				}
				hits[u].Add(1)
			})
			for u := range hits {
				if h := hits[u].Load(); h != 1 {
					t.Fatalf("threads %d region %d: unit %d ran %d times", threads, region, u, h)
				}
			}
			if badWorker.Load() {
				t.Fatalf("threads %d region %d: worker number outside [0, %d)", threads, region, threads)
			}
		}
		tm.stop()
	}
}

// TestForwardLeavesNoGoroutines: Forward's helpers stop before it returns,
// also when it fails.
func TestForwardLeavesNoGoroutines(t *testing.T) {
	defer goleak.VerifyNone(t)
	m := tinyModel(t)
	m.SetThreads(3)
	run(t, m, testTokens, 5)
	m.SetExperts(failing{})
	defer m.SetExperts(nil)
	seq := m.NewSequence()
	err := m.Forward(context.Background(), []Row{{Seq: seq, Token: 1, Pos: 0, Logits: true}}, make([]float32, m.Params().Vocab))
	if !errors.Is(err, errFailing) {
		t.Fatalf("Forward with failing experts: %v", err)
	}
}

var errFailing = errors.New("test: experts fail")

// failing is an expert.Computer that always fails.
type failing struct{}

func (failing) ComputeExperts(context.Context, int, []float32, []int32, int, int, []float32) error {
	return errFailing
}
