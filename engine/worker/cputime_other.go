//go:build !unix && !windows

package worker

import "time"

// processCPU reports that this OS gives no process CPU time here; the CPU
// limit then charges each request its compute time times the worker's
// threads (see dutyCycle).
func processCPU() (cpu time.Duration, ok bool) { return 0, false }
