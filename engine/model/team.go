package model

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// team runs the parallel regions of one Forward call (projections,
// attention, experts) on threads-1 helper goroutines, so that a token's
// ~300 regions (48 layers x 6) start no goroutine of their own.
//
// A region hands out units [0, n) in order from a shared counter; the
// caller works on it too. Between regions a helper spins, polling and
// yielding the processor in turn (runtime.Gosched, so other goroutines
// such as an expert Computer's keep running), for up to spinTime before it blocks on its
// wake channel; the caller waits for the helpers at the end of a region
// the same way. The serial steps between two regions of a decode step
// (norms, rope, routing) take microseconds, and waking a blocked thread
// takes tens of them on a virtual machine: spinning through them keeps
// both cores on the weights. Which goroutine computes a unit never
// changes what it computes.
//
// The helpers outlive a Forward by about spinTime: after stop they spin
// on for that long, and the next Forward's start takes them over if it
// comes in time (a decode loop's next token: the gap is the sampling of
// one row); else each returns on its own. A start that found them gone
// had to wake an idle core, which took ~150 us per token on the 2-vCPU
// virtual machine of docs/BENCHMARKS.md (the helper's first region began
// that late). Tests checking for leaked goroutines (goleak, which retries
// for up to a second) therefore see none.
type team struct {
	helpers int           // helpers of the running Forward (0 outside one)
	gen     atomic.Uint64 // region number; a helper joins each new one
	quit    atomic.Bool
	next    atomic.Int64 // next unit of the current region
	busy    atomic.Int64 // helpers still inside the current region
	units   int
	fn      func(worker, unit int)
	wake    []chan struct{} // per helper, capacity 1
	done    chan struct{}   // capacity 1: the last helper out of a region
	wg      sync.WaitGroup

	mu    sync.Mutex // guards alive and open: the helpers' life
	alive int        // helper goroutines running
	open  bool       // between start and stop
}

// spinTime bounds how long an idle helper (or the caller waiting for its
// helpers) spins before blocking: longer than the serial work between two
// regions of a decode step, short enough that an idle Forward (between
// tokens of a slow client) gives its cores back at once.
const spinTime = 200 * time.Microsecond

// spinCheck is how many yields pass between two clock reads while spinning.
const spinCheck = 16

// spinPolls is how many times spinUntil checks its condition between two
// yields (a few hundred nanoseconds of loads of one cache line): a yield
// goes through the scheduler (~1 us on a virtual machine, its lock shared
// with the other spinning thread), so checking only once per yield saw a
// region's start or end that much later, 41 times per decode step.
const spinPolls = 64

// start provides threads-1 helpers (none for threads <= 1): those still
// lingering from the last Forward when there are as many, else new ones.
func (t *team) start(threads int) {
	need := max(0, threads-1)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.alive > 0 && t.alive != need {
		// Another number of helpers: end the lingering ones first.
		t.quit.Store(true)
		t.gen.Add(1)
		for w := range t.wake {
			t.signal(t.wake[w])
		}
		t.mu.Unlock()
		t.wg.Wait()
		t.mu.Lock()
		t.quit.Store(false)
	}
	t.open = true
	t.helpers = need
	if t.alive == need {
		return // taken over (or none needed)
	}
	if len(t.wake) < need {
		t.wake = make([]chan struct{}, need)
		for i := range t.wake {
			t.wake[i] = make(chan struct{}, 1)
		}
	}
	if t.done == nil {
		t.done = make(chan struct{}, 1)
	}
	t.alive = need
	t.wg.Add(need)
	for w := 1; w <= need; w++ {
		go t.helper(w, t.gen.Load())
	}
}

// stop ends the Forward's use of the helpers without waiting for them:
// they linger for spinTime (see team), then return unless a start has
// taken them over.
func (t *team) stop() {
	if t.helpers == 0 {
		return
	}
	t.mu.Lock()
	t.open = false
	t.mu.Unlock()
	for w := range t.helpers {
		t.signal(t.wake[w]) // a blocked helper spins its spinTime, then returns
	}
	t.helpers = 0
}

// signal makes a pending wake-up on c without blocking (one is enough).
func (t *team) signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// spinUntil checks cond spinPolls times per yield until it holds or
// spinTime has passed, and reports whether cond holds.
func spinUntil(cond func() bool) bool {
	var t0 time.Time
	for i := 0; ; i++ {
		for range spinPolls {
			if cond() {
				return true
			}
		}
		if i%spinCheck == 0 {
			if i == 0 {
				t0 = time.Now()
			} else if time.Since(t0) > spinTime {
				return cond()
			}
		}
		runtime.Gosched()
	}
}

func (t *team) helper(w int, seen uint64) {
	defer t.wg.Done()
	for {
		if !spinUntil(func() bool { return t.gen.Load() != seen }) {
			t.mu.Lock()
			if !t.open { // lingered after a Forward and none came
				t.alive--
				t.mu.Unlock()
				return
			}
			t.mu.Unlock()
			<-t.wake[w-1] // may be stale: the loop checks gen again
			continue
		}
		seen = t.gen.Load()
		if t.quit.Load() {
			t.mu.Lock()
			t.alive--
			t.mu.Unlock()
			return
		}
		t.work(w)
		if t.busy.Add(-1) == 0 {
			t.signal(t.done)
		}
	}
}

func (t *team) work(w int) {
	for {
		u := int(t.next.Add(1) - 1)
		if u >= t.units {
			return
		}
		t.fn(w, u)
	}
}

// run calls fn(worker, unit) for every unit in [0, n), worker in
// [0, helpers], and returns when all calls have returned. With no helpers,
// or one unit, it runs them in order on the caller.
func (t *team) run(n int, fn func(worker, unit int)) {
	if t.helpers == 0 || n <= 1 {
		for u := range n {
			fn(0, u)
		}
		return
	}
	t.fn, t.units = fn, n
	t.next.Store(0)
	t.busy.Store(int64(t.helpers))
	t.gen.Add(1)
	for w := range t.helpers {
		t.signal(t.wake[w])
	}
	t.work(0)
	for !spinUntil(func() bool { return t.busy.Load() == 0 }) {
		<-t.done // may be stale: the loop checks busy again
	}
	t.fn = nil
}
