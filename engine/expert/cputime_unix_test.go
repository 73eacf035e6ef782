//go:build unix

package expert

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time (user+system) used by this process so
// far; benchmarks report throughput per CPU-second with it, which stays
// meaningful on a machine shared with other jobs.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
