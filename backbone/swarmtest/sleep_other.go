//go:build !linux

package swarmtest

import "time"

// sleepUntil waits until t with the runtime's timers.
func sleepUntil(t time.Time) { time.Sleep(time.Until(t)) }
