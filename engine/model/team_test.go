package model

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestTeam: every unit of every region runs exactly once, on a worker
// number in [0, threads), whether a start takes over the helpers lingering
// from the last stop (same number), ends them for another number, or
// finds them gone; and the helpers return on their own after the last
// stop (goleak waits for them).
func TestTeam(t *testing.T) {
	defer goleak.VerifyNone(t)
	var tm team
	for i, threads := range []int{1, 2, 5, 5, 2, 2, 3, 1, 2} {
		if i == 7 {
			time.Sleep(50 * spinTime) // the lingering helpers return first
		}
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

// TestForwardLeavesNoGoroutines: Forward's helpers return after it (once
// their lingering for a next Forward is over; goleak waits for them),
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

// TestParallelPrefillInvariance: a prompt long enough for every parallel
// path of a prefill (activation conversion split over the team, guided
// projection chunks of many rows, the expert function's batch phases)
// gives on 3 threads in one batch the bits of 1 thread token by token.
func TestParallelPrefillInvariance(t *testing.T) {
	m := tinyModel(t)
	tokens := make([]int32, 80)
	for i := range tokens {
		tokens[i] = int32(i*37+5) % int32(m.Params().Vocab)
	}
	m.SetThreads(1)
	ref := run(t, m, tokens, 1)
	m.SetThreads(3)
	defer m.SetThreads(0)
	sameBits(t, "one batch of 80, 3 threads", run(t, m, tokens, len(tokens)), ref)
	sameBits(t, "batches of 33, 3 threads", run(t, m, tokens, 33), ref)
}

// TestRider: a rider's extra units run exactly once, in the first region
// it is given (after that region's own units, which keep their numbers)
// or at flush when no region came, and a second region gets none.
func TestRider(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, threads := range []int{1, 3} {
		var tm team
		tm.start(threads)
		for _, regions := range [][]int{{5, 2}, {0}, {1, 4}, {}} {
			extra := make([]atomic.Int32, 4)
			r := rider{run: tm.run, units: len(extra), unit: func(_, u int) { extra[u].Add(1) }}
			var seen []int
			for i, n := range regions {
				own := make([]atomic.Int32, n)
				r.Run(n, func(_, u int) { own[u].Add(1) })
				for u := range own {
					if h := own[u].Load(); h != 1 {
						t.Fatalf("threads %d regions %v: region %d unit %d ran %d times", threads, regions, i, u, h)
					}
				}
				ran := 0
				for u := range extra {
					ran += int(extra[u].Load())
				}
				seen = append(seen, ran)
			}
			r.flush()
			for u := range extra {
				if h := extra[u].Load(); h != 1 {
					t.Fatalf("threads %d regions %v: extra unit %d ran %d times", threads, regions, u, h)
				}
			}
			if len(regions) > 0 && seen[0] != len(extra) {
				t.Fatalf("threads %d regions %v: %d extra units after the first region, want %d", threads, regions, seen[0], len(extra))
			}
		}
		tm.stop()
	}
}
