// Package cputime reads the CPU time this process has used: the worker's
// CPU limit (engine/worker) budgets it, and benchmarks report it beside
// wall-clock rates (cpu-us/tok and the like), which on a shared machine
// say less than the CPU a run actually used.
package cputime

import "time"

// Used is Process's CPU time, or 0 where the OS gives none: for
// benchmarks, which report a per-op CPU figure only when it is above 0.
func Used() time.Duration {
	c, _ := Process()
	return c
}
