//go:build !unix

package expert

import "time"

// processCPU is not measured on this OS (the per-CPU metric is skipped).
func processCPU() time.Duration { return 0 }
