//go:build unix

package cputime

import (
	"syscall"
	"time"
)

// Process returns the CPU time (user + system) this process has used
// since it started, all threads together, from getrusage(RUSAGE_SELF)
// (getrusage(2)); ok is false when the call fails.
func Process() (cpu time.Duration, ok bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
