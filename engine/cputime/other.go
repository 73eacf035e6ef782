//go:build !unix && !windows

package cputime

import "time"

// Process reports that this OS gives no process CPU time here (ok false).
func Process() (cpu time.Duration, ok bool) { return 0, false }
