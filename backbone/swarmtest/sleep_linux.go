//go:build linux

package swarmtest

import (
	"time"

	"golang.org/x/sys/unix"
)

// sleepUntil blocks its thread in nanosleep until t (tens of microseconds
// late at most on an idle Linux machine, the timer slack).
func sleepUntil(t time.Time) {
	for {
		d := time.Until(t)
		if d <= 0 {
			return
		}
		ts := unix.NsecToTimespec(int64(d))
		if err := unix.Nanosleep(&ts, nil); err == nil {
			return
		}
	}
}
