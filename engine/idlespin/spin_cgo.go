//go:build linux && cgo

package idlespin

/*
#cgo CFLAGS: -O2
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static atomic_int kv_holds;          // Hold calls not yet released
static atomic_uint kv_gen;           // futex word: bumped by each hold to wake sleepers
static atomic_int kv_sleepers;       // threads in (or entering) FUTEX_WAIT on kv_gen
static atomic_llong kv_until;        // CLOCK_MONOTONIC ns: no spinning after this
static atomic_llong kv_cpu_ns;       // CPU time of finished spinning episodes, all threads
static atomic_ullong kv_spins;       // spinning episodes
static atomic_ullong kv_nholds;      // holds
static atomic_int kv_spinning;       // threads spinning now
static long long kv_max_ns;          // one hold's longest spin
static atomic_int kv_reported;       // threads past their SCHED_IDLE switch
static atomic_int kv_ok;             // of which spinning at SCHED_IDLE
static atomic_int kv_err;            // the errno of a failed switch

static long long kv_clock(clockid_t id) {
	struct timespec ts;
	clock_gettime(id, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline void kv_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield" ::: "memory");
#endif
}

static int kv_wanted(void) {
	return atomic_load(&kv_holds) > 0 && kv_clock(CLOCK_MONOTONIC) < atomic_load(&kv_until);
}

static void *kv_main(void *arg) {
	int cpu = (int)(intptr_t)arg;
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	sched_setaffinity(0, sizeof set, &set); // this thread: best effort
	struct sched_param sp = {0};
	// This thread only (Linux). A spinner that could not drop to
	// SCHED_IDLE would take CPU time from work: it ends instead.
	if (sched_setscheduler(0, SCHED_IDLE, &sp) != 0) {
		atomic_store(&kv_err, errno);
		atomic_fetch_add(&kv_reported, 1);
		return NULL;
	}
	atomic_fetch_add(&kv_ok, 1);
	atomic_fetch_add(&kv_reported, 1);
	for (;;) {
		unsigned g = atomic_load(&kv_gen);
		if (!kv_wanted()) {
			// A hold after the load of g bumps kv_gen: the wait then
			// returns at once; one before the sleeper count rose is
			// seen by kv_wanted on the next turn.
			atomic_fetch_add(&kv_sleepers, 1);
			syscall(SYS_futex, &kv_gen, FUTEX_WAIT_PRIVATE, g, NULL, NULL, 0);
			atomic_fetch_sub(&kv_sleepers, 1);
			continue;
		}
		atomic_fetch_add(&kv_spinning, 1);
		long long c0 = kv_clock(CLOCK_THREAD_CPUTIME_ID);
		do {
			for (int i = 0; i < 256 && atomic_load_explicit(&kv_holds, memory_order_relaxed) > 0; i++)
				kv_pause();
		} while (kv_wanted());
		atomic_fetch_add(&kv_cpu_ns, kv_clock(CLOCK_THREAD_CPUTIME_ID) - c0);
		atomic_fetch_add(&kv_spins, 1);
		atomic_fetch_sub(&kv_spinning, 1);
	}
	return NULL;
}

// kv_start starts up to n spinner threads, one per CPU of the process's
// affinity mask, with signals blocked (Go's handlers stay on Go's threads),
// and waits for them to switch to SCHED_IDLE (one that cannot ends).
// Returns the number spinning at SCHED_IDLE, or -errno when none is.
static int kv_start(int n, long long max_ns) {
	cpu_set_t mask;
	if (sched_getaffinity(0, sizeof mask, &mask) != 0)
		return -errno;
	kv_max_ns = max_ns;
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	int started = 0, err = 0;
	for (int cpu = 0; cpu < CPU_SETSIZE && started < n; cpu++) {
		if (!CPU_ISSET(cpu, &mask))
			continue;
		pthread_attr_t attr;
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		pthread_attr_setstacksize(&attr, 64 << 10);
		pthread_t t;
		err = pthread_create(&t, &attr, kv_main, (void *)(intptr_t)cpu);
		pthread_attr_destroy(&attr);
		if (err != 0)
			break;
		started++;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (started == 0)
		return -err;
	// Wait (up to 1 s) for each to say whether it runs at SCHED_IDLE.
	struct timespec tick = {0, 100000};
	for (int i = 0; i < 10000 && atomic_load(&kv_reported) < started; i++)
		nanosleep(&tick, NULL);
	int ok = atomic_load(&kv_ok);
	if (ok == 0)
		return atomic_load(&kv_err) ? -atomic_load(&kv_err) : -EAGAIN;
	return ok;
}

static void kv_hold(void) {
	atomic_store(&kv_until, kv_clock(CLOCK_MONOTONIC) + kv_max_ns);
	atomic_fetch_add(&kv_holds, 1);
	atomic_fetch_add(&kv_nholds, 1);
	atomic_fetch_add(&kv_gen, 1);
	if (atomic_load(&kv_sleepers) > 0)
		syscall(SYS_futex, &kv_gen, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static void kv_release(void) { atomic_fetch_sub(&kv_holds, 1); }

static void kv_stats(unsigned long long *holds, unsigned long long *spins, long long *cpu_ns, int *spinning) {
	*spinning = atomic_load(&kv_spinning);
	*holds = atomic_load(&kv_nholds);
	*spins = atomic_load(&kv_spins);
	*cpu_ns = atomic_load(&kv_cpu_ns);
}
*/
import "C"

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

var (
	startMu sync.Mutex
	threads atomic.Int32 // spinner threads running; 0 before Start
	maxHold time.Duration
)

// Start starts the spinner threads: one per CPU of the process's affinity
// mask, at most threads of them (pinned to the mask's first CPUs), each
// spinning at most max per hold. Only the first successful call starts
// threads; later ones return nil and change nothing. Errors: threads < 1 or
// max <= 0, or the OS's (sched_getaffinity, pthread_create) when no thread
// could be started.
func Start(nthreads int, max time.Duration) error {
	if err := checkArgs(nthreads, max); err != nil {
		return err
	}
	startMu.Lock()
	defer startMu.Unlock()
	if threads.Load() > 0 {
		return nil
	}
	n := int(C.kv_start(C.int(nthreads), C.longlong(max)))
	if n <= 0 {
		return fmt.Errorf("idlespin: starting spinner threads: %w", syscall.Errno(-n))
	}
	maxHold = max
	threads.Store(int32(n))
	return nil
}

// Hold wakes the spinners (if Start has run) and keeps them spinning until
// every holder has called its release, or for Start's max after the latest
// hold, whichever comes first. Call release exactly once. Holding costs two
// cgo calls and, when the spinners slept, one futex wake.
func Hold() (release func()) {
	if threads.Load() == 0 {
		return noop
	}
	C.kv_hold()
	return releaseHold
}

func releaseHold() { C.kv_release() }

// Read returns the spinners' counters.
func Read() Stats {
	var holds, spins C.ulonglong
	var cpu C.longlong
	var spinning C.int
	C.kv_stats(&holds, &spins, &cpu, &spinning)
	startMu.Lock()
	m := maxHold
	startMu.Unlock()
	return Stats{Threads: int(threads.Load()), Holds: uint64(holds), Spins: uint64(spins), Spinning: int(spinning), CPU: time.Duration(cpu), Max: m}
}
