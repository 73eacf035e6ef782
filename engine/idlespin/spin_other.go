//go:build !linux || !cgo

package idlespin

import "time"

// Start returns ErrUnsupported (after the argument check of the Linux
// build): this build has no spinner threads.
func Start(threads int, max time.Duration) error {
	if err := checkArgs(threads, max); err != nil {
		return err
	}
	return ErrUnsupported
}

// Hold does nothing on this build.
func Hold() (release func()) { return noop }

// Read returns zero Stats on this build.
func Read() Stats { return Stats{} }
