package swarmtest

import (
	"os"
	"time"
)

// BenchSpinWait is the benchmarks' dispatch.Config.SpinWait: 0 (the
// default, dispatch.DefaultSpinWait) or, with KVASIR_BENCH_SPIN=0 in the
// environment, -1 (idle spinning off), for a before/after comparison. The
// spinner threads are per process: compare in two runs, or give one
// dispatcher of the run -1 itself.
func BenchSpinWait() time.Duration {
	if os.Getenv("KVASIR_BENCH_SPIN") == "0" {
		return -1
	}
	return 0
}
