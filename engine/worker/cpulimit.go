package worker

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"time"

	"github.com/kvasir-ai/kvasir/engine/cputime"
	"github.com/kvasir-ai/kvasir/engine/idlespin"
)

// The CPU limit (Config.CPULimit, SetCPULimit) is a duty cycle: the worker
// works at full speed, and when the CPU time its process used beyond its
// share reaches MinRest worth of that share, it rests (sends PAUSE 1, so
// the backbone routes its work elsewhere) until the excess is paid back,
// then takes work again (PAUSE 0). The share is pct percent of the
// machine's CPUs:
//
//	rate = pct/100 x cores    CPU seconds per wall second
//
// After a request whose computation took c seconds of wall time on T busy
// threads (c x T CPU seconds), keeping the average at rate needs a rest of
//
//	r = c x T / rate - c = c x (T/cores x 100/pct - 1)    (0 when T/cores <= pct/100)
//
// which is c x (100/pct - 1) when the worker uses every core (restAfter).
// The worker does not rest after each request (a rest is at least MinRest,
// so the backbone is not told PAUSE for every millisecond): it keeps a
// debt, the CPU seconds used beyond rate x elapsed time since the limit
// was set (never below 0: idle time is not banked for later bursts), and
// rests debt/rate once the debt reaches rate x MinRest (dutyCycle).
//
// The CPU time is measured, not assumed: the process's own user + system
// time (getrusage on Unix, GetProcessTimes on Windows), read before and
// after each request and when a rest ends, so everything the process does
// counts (the window of the app too, the downloads, the garbage
// collector). Where the OS gives no process CPU time each request is
// charged its compute time x min(Threads, cores).
//
// Guarantee: over any stretch of L seconds the process uses at most
// rate x (L + MinRest) CPU seconds plus one request's CPU time (the debt
// a rest starts at, and the request that crossed it). DISPATCHes already
// sent when a rest starts are computed at once (they count towards the
// debt), so the backbone's per-request deadline holds: a limited worker's
// answers are as fast as an unlimited one's, it only takes fewer requests.
// Its state stays StateConnected while it rests (Stats.Resting says so).
// A limit below what the process uses without work (the app's window: a
// few percent of one core) leaves it resting until the limit is raised.

// MinRest is the shortest rest of a CPU-limited worker: it rests once it
// has used rate x MinRest CPU seconds beyond its share.
const MinRest = 500 * time.Millisecond

// ErrCPULimit is wrapped by the error of a CPU limit outside 0..100.
var ErrCPULimit = errors.New("worker: CPU limit must be 1-100 % (0 or 100: no limit)")

// checkCPULimit validates a CPU limit in percent.
func checkCPULimit(pct int) error {
	if pct < 0 || pct > 100 {
		return fmt.Errorf("%w: got %d", ErrCPULimit, pct)
	}
	return nil
}

// restAfter is the rest that keeps a worker's average CPU use at pct
// percent of cores CPUs after a request that used cpu of CPU time in wall
// of wall time: max(0, cpu / (pct/100 x cores) - wall). pct outside
// 1..99 (no limit) or cores < 1 gives 0.
func restAfter(cpu, wall time.Duration, pct, cores int) time.Duration {
	if pct <= 0 || pct >= 100 || cores < 1 {
		return 0
	}
	r := time.Duration(float64(cpu)*100/float64(pct*cores)) - wall
	return max(r, 0)
}

// dutyCycle is the CPU limit's accounting. The zero value is no limit.
// Not safe for concurrent use (the Worker holds w.mu).
type dutyCycle struct {
	pct   int     // the limit, percent of all cores; 0: none
	rate  float64 // CPU seconds allowed per wall second: pct/100 x cores
	debt  float64 // CPU seconds used beyond rate since the limit was set, >= 0
	at    time.Time
	cpu   time.Duration // the process CPU time at `at`
	valid bool          // at and cpu hold an observation
}

// set sets the limit to pct percent of cores CPUs (0 or 100: none) at now,
// when the process CPU time is cpu. Going from no limit to a limit starts
// with no debt; a change between limits keeps the debt.
func (d *dutyCycle) set(pct, cores int, now time.Time, cpu time.Duration) {
	if pct >= 100 || pct <= 0 || cores < 1 {
		*d = dutyCycle{}
		return
	}
	if d.pct == 0 {
		d.debt, d.at, d.cpu, d.valid = 0, now, cpu, true
	}
	d.pct, d.rate = pct, float64(pct)/100*float64(cores)
}

// on reports whether a limit is set.
func (d *dutyCycle) on() bool { return d.pct > 0 }

// observe charges the CPU time used since the last observation (cpu is
// the process's total at now) and pays back rate x the time elapsed.
func (d *dutyCycle) observe(now time.Time, cpu time.Duration) {
	if !d.on() {
		return
	}
	if d.valid {
		used := max(cpu-d.cpu, 0).Seconds()
		paid := d.rate * max(now.Sub(d.at), 0).Seconds()
		d.debt = max(d.debt+used-paid, 0)
	}
	d.at, d.cpu, d.valid = now, cpu, true
}

// due reports whether the debt calls for a rest: it reached rate x
// MinRest.
func (d *dutyCycle) due() bool { return d.on() && d.debt >= d.rate*MinRest.Seconds() }

// owed reports whether any debt is left that a rest should still pay
// (more than 1 ms worth of the share).
func (d *dutyCycle) owed() bool { return d.on() && d.debt > d.rate*time.Millisecond.Seconds() }

// rest returns how long the debt takes to pay back: debt / rate.
func (d *dutyCycle) rest() time.Duration {
	if !d.on() {
		return 0
	}
	return time.Duration(math.Round(d.debt / d.rate * float64(time.Second)))
}

// cores is the machine's CPU count the limit is a share of.
var cores = runtime.NumCPU()

// cpuNow returns the process CPU time (processCPU) less the idle
// spinners' (engine/idlespin: time no other thread wanted), or, where the
// OS gives none, the compute time charged so far (Worker.charged).
func (w *Worker) cpuNow() time.Duration {
	if c, ok := cputime.Process(); ok {
		return c - idlespin.Read().CPU
	}
	return time.Duration(w.charged.Load())
}

// SetCPULimit limits the worker's process to pct percent of the machine's
// CPU time (1-100; 0 or 100: no limit), at once and without a new
// session. Errors wrap ErrCPULimit.
func (w *Worker) SetCPULimit(pct int) error {
	if err := checkCPULimit(pct); err != nil {
		return err
	}
	now, cpu := time.Now(), w.cpuNow()
	w.mu.Lock()
	w.duty.set(pct, cores, now, cpu)
	w.st.CPULimit = w.duty.pct
	end := w.resting && !w.duty.on()
	if end {
		w.endRestLocked(now)
	}
	w.mu.Unlock()
	if end {
		w.poke()
	} else {
		w.dutyCheck() // a lower limit may call for a rest now
	}
	return nil
}

// dutyCheck charges the CPU time used since the last check and starts a
// rest when the debt calls for one. computeLoop calls it before and after
// each request.
func (w *Worker) dutyCheck() {
	w.mu.Lock()
	on := w.duty.on()
	w.mu.Unlock()
	if !on {
		return
	}
	now, cpu := time.Now(), w.cpuNow()
	w.mu.Lock()
	w.duty.observe(now, cpu)
	start := !w.resting && w.duty.due()
	if start {
		w.resting, w.restFrom = true, now
		w.rests++
		w.restTimer = time.AfterFunc(w.duty.rest(), w.restCheck)
	}
	w.mu.Unlock()
	if start {
		w.poke()
	}
}

// restCheck runs when a rest should be over: it charges what the process
// used meanwhile (DISPATCHes that were on the way, the process's own
// overhead) and rests on until the debt is paid, else ends the rest.
func (w *Worker) restCheck() {
	now, cpu := time.Now(), w.cpuNow()
	w.mu.Lock()
	if !w.resting {
		w.mu.Unlock()
		return
	}
	w.duty.observe(now, cpu)
	if w.duty.owed() {
		w.restTimer = time.AfterFunc(w.duty.rest(), w.restCheck)
		w.mu.Unlock()
		return
	}
	w.endRestLocked(now)
	w.mu.Unlock()
	w.poke()
}

// endRestLocked ends a rest at now; w.mu held.
func (w *Worker) endRestLocked(now time.Time) {
	if w.restTimer != nil {
		w.restTimer.Stop()
		w.restTimer = nil
	}
	w.resting = false
	w.restNanos += int64(now.Sub(w.restFrom))
}
