//go:build unix

package dispatch_test

import (
	"syscall"
	"time"
)

// cpuTime is the process's user + system CPU time so far (getrusage), to
// tell the CPU a benchmark used from the share of the machine it got.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
