//go:build !linux

package dispatch

// yieldThread does nothing where sched_yield is not available: the
// goroutine's runtime.Gosched is the only yield.
func yieldThread() {}
