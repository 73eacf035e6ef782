//go:build !unix

package serve

import "time"

// cpuTime is not measured on this platform (cpu-ms/tok reads 0).
func cpuTime() time.Duration { return 0 }
