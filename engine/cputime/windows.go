//go:build windows

package cputime

import (
	"syscall"
	"time"
)

// Process returns the CPU time (user + kernel) this process has used
// since it started, all threads together, from GetProcessTimes (100 ns
// units); ok is false when the call fails.
func Process() (cpu time.Duration, ok bool) {
	var creation, exit, kernel, user syscall.Filetime
	h, err := syscall.GetCurrentProcess()
	if err != nil {
		return 0, false
	}
	if err := syscall.GetProcessTimes(h, &creation, &exit, &kernel, &user); err != nil {
		return 0, false
	}
	ticks := func(f syscall.Filetime) int64 { return int64(f.HighDateTime)<<32 | int64(f.LowDateTime) }
	return time.Duration((ticks(kernel) + ticks(user)) * 100), true
}
