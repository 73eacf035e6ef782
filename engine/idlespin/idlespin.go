// Package idlespin keeps a process's CPUs awake while it waits a few
// milliseconds for a reply, so that the thread the reply wakes runs at once.
//
// A backbone whose experts are remote spends most of a step waiting for a
// round trip (issue 19). Every CPU of the machine then has nothing to run and
// halts; when the answer arrives the kernel must wake a halted CPU to run the
// thread that reads it, and every layer computed after that starts on cold
// cores. On the 2-vCPU virtual machines this project is measured on, that
// costs 2-3 ms per 13 ms round trip (docs/BENCHMARKS-by-hand.md, "Polling
// through the round trip"); a bare-metal CPU pays less (its deepest idle
// state's exit latency, ~0.1 ms, and a frequency ramp).
//
// While at least one caller holds it (Hold), idlespin runs one thread per CPU
// (up to the count given to Start) that spins with the CPU's pause
// instruction at SCHED_IDLE priority (sched(7)): the CPU never halts, and any
// ordinary thread that becomes runnable preempts the spinner at once, so the
// spinning takes no CPU time from work. It is the user-space form of the
// kernel's idle=poll and of llama.cpp's polling thread pool (its --poll,
// 50 by default), limited to the waits that need it: with no holder the
// threads sleep on a futex, and a hold lasts at most the maximum given to
// Start, however long the wait.
//
// The spinner threads are C threads (cgo, Linux only) that hold no Go P: a
// spinning goroutine would keep the Go scheduler from its network poller (a
// dispatcher that polled for replies from Go doubled the round trips of a
// two-request call; see the same section). On other builds Start returns
// ErrUnsupported and Hold does nothing.
package idlespin

import (
	"errors"
	"fmt"
	"time"
)

// ErrUnsupported is Start's error on a build without spinner threads (not
// Linux, or built with CGO_ENABLED=0).
var ErrUnsupported = errors.New("idlespin: needs linux and cgo")

// Stats describes the spinners since the process started.
type Stats struct {
	Threads  int           // spinner threads running (0 before Start)
	Holds    uint64        // Hold calls that found the spinners enabled
	Spins    uint64        // finished spinning episodes (a thread woken, spinning until released or the maximum)
	Spinning int           // threads spinning now
	CPU      time.Duration // CPU time the spinner threads used in finished episodes, all together (CLOCK_THREAD_CPUTIME_ID)
	Max      time.Duration // the longest one hold keeps them spinning (Start's max)
}

func noop() {}

// checkArgs is Start's argument check, on every build.
func checkArgs(threads int, max time.Duration) error {
	if threads < 1 || max <= 0 {
		return fmt.Errorf("idlespin: want threads >= 1 and max > 0, got %d and %v", threads, max)
	}
	return nil
}
