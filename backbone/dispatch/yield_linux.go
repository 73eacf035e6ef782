//go:build linux

package dispatch

import "golang.org/x/sys/unix"

// yieldThread gives the calling thread's CPU to any other runnable thread
// (sched_yield(2); it cannot fail on Linux).
func yieldThread() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
