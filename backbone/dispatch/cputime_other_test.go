//go:build !unix

package dispatch_test

import "time"

// cpuTime is not measured on this platform (cpu-us/tok reads 0).
func cpuTime() time.Duration { return 0 }
